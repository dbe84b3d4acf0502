"""The recipe lab: points from runs and cooldown branches, sweeps, the fit of
L(N, D) = E + A/N^α + B/D^β, its plots and its prediction for the calculator.

    points.py   a run's point (N, D, final val loss) and the divergence watch
    branch.py   cooldown branches: a short decay from a checkpoint of a WSD run
    sweep.py    grids of runs and branches, with one progress table
    runners.py  how a sweep runs them: the notebook here, this process, or spread by Auto
    fit.py      the Huber fit in log space, bootstrap intervals, fits on disk
    predict.py  the calculator's `predicted_val_loss` (kind "fitted")
    plots.py    the figures (PNG and the control notebook)
"""
