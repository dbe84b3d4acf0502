"""Small dense linear algebra for the speed fit, in plain Python: the calculator answers on
every keystroke without numpy. Sizes here are a handful of unknowns and a few dozen rows."""
from __future__ import annotations

Matrix = list[list[float]]


def solve_spd(a: Matrix, b: list[float]) -> list[float]:
    """x with a·x = b for a symmetric positive definite `a` (Cholesky)."""
    n = len(a)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = a[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            if i == j:
                if s <= 0:
                    raise ValueError("matrix is not positive definite")
                low[i][i] = s ** 0.5
            else:
                low[i][j] = s / low[j][j]
    y = [0.0] * n
    for i in range(n):
        y[i] = (b[i] - sum(low[i][k] * y[k] for k in range(i))) / low[i][i]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (y[i] - sum(low[k][i] * x[k] for k in range(i + 1, n))) / low[i][i]
    return x


def inverse_spd(a: Matrix) -> Matrix:
    n = len(a)
    cols = [solve_spd(a, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    return [[cols[j][i] for j in range(n)] for i in range(n)]


def normal_equations(rows: Matrix, rhs: list[float], cols: list[int]) -> tuple[Matrix, list[float]]:
    """AᵀA and Aᵀb restricted to the columns `cols`."""
    ata = [[sum(r[i] * r[j] for r in rows) for j in cols] for i in cols]
    atb = [sum(r[i] * y for r, y in zip(rows, rhs)) for i in cols]
    return ata, atb


def nnls(rows: Matrix, rhs: list[float], tol: float = 1e-12, max_iter: int = 200) -> list[float]:
    """min ‖A·x − b‖ subject to x ≥ 0 (Lawson and Hanson's active-set method). The callers'
    rows include a ridge, so every least-squares subproblem here is well posed."""
    n = len(rows[0])
    x, passive = [0.0] * n, []
    for _ in range(max_iter):
        resid = [y - sum(r[j] * x[j] for j in range(n)) for r, y in zip(rows, rhs)]
        grad = [sum(r[j] * e for r, e in zip(rows, resid)) for j in range(n)]
        free = [j for j in range(n) if j not in passive and grad[j] > tol]
        if not free:
            return x
        passive.append(max(free, key=lambda j: grad[j]))
        while True:
            ata, atb = normal_equations(rows, rhs, passive)
            z = dict(zip(passive, solve_spd(ata, atb)))
            if all(v > 0 for v in z.values()):
                x = [z.get(j, 0.0) for j in range(n)]
                break
            # Step back to the boundary and drop the variables that reached zero.
            alpha = min(x[j] / (x[j] - z[j]) for j in passive if z[j] <= 0)
            x = [x[j] + alpha * (z[j] - x[j]) if j in z else 0.0 for j in range(n)]
            passive = [j for j in passive if x[j] > tol]
            if not passive:
                break
    return x
