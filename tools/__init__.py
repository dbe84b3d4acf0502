"""Tools for trying and testing the kit that the kit itself does not ship."""
