"""A Slurm cluster as one of the lab's machines: a partition the lab's runs go to as jobs.

A link is one `sbatch` job that runs the training notebook under papermill on each of its nodes
(one task per node under `srun`; torchrun inside starts one process per card, and several nodes
meet at the first one, read from Slurm's own environment). The job's time limit and a
preemption end a link the way a Kaggle session's limit does: the saver runs first (the
notebook's own limit lies inside the job's, and Slurm signals the job before its end), and the
next link goes on from the checkpoint, in a new job or on another machine.

    cluster    the cluster as stored here (`lab machines add NAME --slurm ...`), and its time rule
    query      what Slurm says: a partition (scontrol, sinfo), a job (scontrol, sacct), a start
    job        the job script, sbatch, scancel, and what the cluster records of each link
    check      `lab machines check NAME`: the partition, and a short measured job on it
    host       the machine for the driver, and a link's verbs for the shared lifecycle

What a cluster shares with the lab's boxes (the person's OpenSSH, the kit's half that runs there,
the store of checked machines) is lab.machines.remote.
"""
