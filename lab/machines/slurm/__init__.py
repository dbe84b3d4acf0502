"""A Slurm cluster as one of the lab's machines: a partition the lab's runs go to as jobs (`host`), as stored
here with its time rule (`cluster`), what Slurm says (`query`), the job script (`job`) and its check (`check`).
What it shares with the lab's boxes is lab.machines.remote."""
