"""What the lab's own machines share, boxes and Slurm clusters alike: the person's OpenSSH client
(`client`), a machine's shell there or here (`shell`), the kit's half that runs there with its own Python
(`half`), and the store of checked machines on this computer (`store`)."""
