"""What the lab's own machines share, boxes and Slurm clusters alike: the person's OpenSSH client and a host
reached through it (`client`), the kit's half that runs there with its own Python (`half`), what goes up and
comes back (`host`), the check (`check`) and the store of checked machines on this computer (`store`)."""
