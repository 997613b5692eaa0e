"""PerFedMask's mask-design problem P^mask (Setayesh, Li, Wong, ICLR 2023) and three solvers.

N devices, J layer groups of |pi_j| parameters (d_w = sum_j |pi_j|), device n may train at most
psi_n parameters. A binary mask m (N x J) says which groups each device trains; with
k_nj = m_nj / sum_n' m_n'j (0 for an empty column) and slack eps_n = psi_n - sum_j |pi_j| m_nj >= 0,
the bias term of the paper's convergence bound is

    f(m) = sum_n [ d_w * max_j k_nj - sum_j |pi_j| k_nj + eps_n ]      (always >= 0)

Solvers: `greedy_masks` (the authors' feasible start), `solve_sca` (their successive convex
approximation, with an open solver), `solve_exact` (enumeration or a MILP). numpy only at import;
cvxpy is imported inside `solve_sca`, scipy inside the MILP.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

METHODS = ("greedy", "sca", "exact")
ENUMERATE_MAX_ENTRIES = 20      # N*J up to this: enumerate every feasible mask
MILP_MAX_BINARIES = 20_000      # N*J*N above this: refuse the exact MILP


@dataclass(frozen=True)
class MaskProblem:
    """One instance: `group_sizes` (J,) positive ints, `budgets` (N,) non-negative floats."""
    group_sizes: np.ndarray
    budgets: np.ndarray

    def __post_init__(self):
        sizes = np.asarray(self.group_sizes)
        budgets = np.asarray(self.budgets, dtype=float)
        if sizes.ndim != 1 or sizes.size == 0:
            raise ValueError(f"group_sizes must be a non-empty 1-D array, got shape {sizes.shape}")
        if budgets.ndim != 1 or budgets.size == 0:
            raise ValueError(f"budgets must be a non-empty 1-D array, got shape {budgets.shape}")
        if not np.issubdtype(sizes.dtype, np.number) or not np.all(np.isfinite(sizes)):
            raise ValueError(f"group_sizes must be finite numbers, got {sizes!r}")
        bad = np.flatnonzero((sizes <= 0) | (sizes != np.round(sizes)))
        if bad.size:
            raise ValueError(f"group_sizes[{bad[0]}] = {sizes[bad[0]].item()!r}: "
                             "every group size must be a positive integer")
        bad = np.flatnonzero(~np.isfinite(budgets) | (budgets < 0))
        if bad.size:
            raise ValueError(f"budgets[{bad[0]}] = {budgets[bad[0]].item()!r}: every budget must be finite and >= 0")
        object.__setattr__(self, "group_sizes", sizes.astype(np.int64))
        object.__setattr__(self, "budgets", budgets)

    @property
    def d_w(self) -> int:
        return int(self.group_sizes.sum())

    @property
    def N(self) -> int:
        return int(self.budgets.size)

    @property
    def J(self) -> int:
        return int(self.group_sizes.size)

    def _limit(self) -> np.ndarray:
        """Budgets with the 1e-9 relative tolerance that every feasibility check here uses."""
        return self.budgets + 1e-9 * np.maximum(self.budgets, 1.0)

    def _binary(self, m) -> np.ndarray:
        arr = np.asarray(m)
        if arr.shape != (self.N, self.J):
            raise ValueError(f"mask shape {arr.shape} != (N, J) = {(self.N, self.J)}")
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError("mask entries must be 0 or 1")
        return arr.astype(bool)

    def feasible(self, m) -> bool:
        """True when m is a binary (N, J) mask that keeps every device within its budget."""
        try:
            arr = self._binary(m)
        except ValueError:
            return False
        return bool(np.all(arr @ self.group_sizes <= self._limit()))

    def objective(self, m) -> float:
        """f(m) for a binary (N, J) mask; ValueError if some device trains more than its budget."""
        arr = self._binary(m)
        over = np.flatnonzero(arr @ self.group_sizes > self._limit())
        if over.size:
            n = over[0]
            raise ValueError(f"device {n} trains {int(arr[n] @ self.group_sizes)} parameters, "
                             f"over its budget {self.budgets[n]}")
        return float(_objectives(self, arr[None])[0])


@dataclass(frozen=True)
class MaskSolution:
    """A solver's answer; `objective` is always f(masks) recomputed by `MaskProblem.objective`."""
    masks: np.ndarray                 # (N, J) bool
    objective: float                  # f(masks), original units (parameters)
    method: str                       # "greedy", "sca", "exact"
    iterations: int = 0               # sca: successful convex solves (0 for greedy and exact)
    greedy_objective: float | None = None   # sca: the objective of its greedy start
    seconds: float = 0.0
    fell_back: bool = False           # sca: the last rounding was worse; the greedy start is returned
    repaired: int = 0                 # sca: groups the returned rounding dropped to fit the budgets
    last_objective: float | None = None  # sca: f of the last iterate's rounding (after repair)
    notes: str = ""


def _objectives(problem: MaskProblem, m: np.ndarray) -> np.ndarray:
    """f for a batch of masks (B, N, J), no feasibility check (eps may come out negative)."""
    sizes, mf = problem.group_sizes.astype(float), m.astype(float)
    k = mf / np.maximum(mf.sum(axis=1, keepdims=True), 1.0)
    per_device = problem.d_w * k.max(axis=2) - k @ sizes + problem.budgets - mf @ sizes
    return per_device.sum(axis=1)


def greedy_masks(problem: MaskProblem, tries: int = 1000, seed: int = 0) -> MaskSolution:
    """The authors' feasible start: the best of `tries` greedy fills.

    Try 0 visits the groups in layer order, every other try in a random order drawn per device
    from np.random.default_rng(seed). Each device takes every group that still fits its budget.
    Deviation: on a group that does not fit, the authors' layer-order try stops filling that
    device; here every try skips it and goes on to the next group (their random tries already do),
    so every device ends with a maximal feasible set. Only a heuristic gain: adding a group does
    not always lower f. The lowest f wins. Like the authors, a try that leaves a device with no
    group is rejected, but only where that device's budget fits some group (a budget that fits
    none trains nothing); with skip-and-continue filling this never triggers.
    """
    t0 = time.perf_counter()
    if tries < 1:
        raise ValueError(f"tries = {tries!r}: need at least 1")
    N, J = problem.N, problem.J
    rng = np.random.default_rng(seed)
    orders = np.empty((tries, N, J), dtype=np.int64)
    orders[0] = np.arange(J)
    if tries > 1:
        orders[1:] = np.argsort(rng.random((tries - 1, N, J)), axis=2)
    limit = problem._limit()
    used = np.zeros((tries, N))
    m = np.zeros((tries, N, J), dtype=bool)
    rows, devs = np.meshgrid(np.arange(tries), np.arange(N), indexing="ij")
    for step in range(J):
        group = orders[:, :, step]
        size = problem.group_sizes[group]
        fits = used + size <= limit         # skip a group that does not fit, keep going
        m[rows, devs, group] = fits
        used += np.where(fits, size, 0)
    values = _objectives(problem, m)
    can_train = problem.group_sizes.min() <= limit
    valid = np.all(m.any(axis=2) | ~can_train, axis=1)
    if not valid.any():   # cannot happen with skip-and-continue filling; kept as a guard
        valid[:] = True
    best = int(np.argmin(np.where(valid, values, np.inf)))
    return MaskSolution(m[best].copy(), float(values[best]), "greedy", seconds=time.perf_counter() - t0)


def _repair(problem: MaskProblem, m: np.ndarray) -> tuple[np.ndarray, int]:
    """Drop groups from over-budget devices, each time the one whose removal gives the lowest f."""
    m, dropped, limit = m.copy(), 0, problem._limit()
    for n in range(problem.N):
        while m[n] @ problem.group_sizes > limit[n]:
            candidates = np.flatnonzero(m[n])
            trial = np.repeat(m[None], candidates.size, axis=0)
            trial[np.arange(candidates.size), n, candidates] = False
            m[n, candidates[int(np.argmin(_objectives(problem, trial)))]] = False
            dropped += 1
    return m, dropped


def _sca_program(problem: MaskProblem, penalty: float):
    """The convex program one SCA iteration solves (see `solve_sca`), built once: (the cvxpy
    problem, its variable M, its parameters M0, K0', S0', 1/2 K0'^2 + 1/2 S0'^2, sum M0^2 that
    each iteration sets from the previous iterate)."""
    import cvxpy as cp

    N, J, d_w = problem.N, problem.J, problem.d_w
    a, b, c = problem.group_sizes / d_w, problem.budgets / d_w, float(np.sqrt(N))
    M, K = cp.Variable((N, J)), cp.Variable((N, J))
    eps, t = cp.Variable(N, nonneg=True), cp.Variable(nonneg=True)
    col = cp.Variable((1, J))               # column sums as a variable: keeps the cone matrix sparse
    # previous iterate: M0, K0' = c*M0/S0, S0' = S0/c, 1/2 K0'^2 + 1/2 S0'^2, sum M0^2 (DPP parameters)
    M0, K0, S0, half_sq = (cp.Parameter((N, J)) for _ in range(4))
    m0_sq = cp.Parameter()
    S = np.ones((N, 1)) @ col
    vec = lambda x: cp.vec(x, order="C")    # noqa: E731
    constraints = [
        M >= 0, M <= 1, M @ a == b - eps, col == cp.sum(M, axis=0, keepdims=True),
        cp.SOC(vec(K + S), cp.vstack([vec(2 * M), vec(K - S)]), axis=0),
        0.5 * cp.square(c * K + S / c) - cp.multiply(K0, c * K) - cp.multiply(S0, S / c) + half_sq <= M,
        cp.sum(M) - 2 * cp.sum(cp.multiply(M0, M)) + m0_sq <= t,
    ]
    objective = cp.sum(cp.max(K, axis=1)) - cp.sum(K @ a) + cp.sum(eps) + (penalty / d_w) * cp.square(t)
    prob = cp.Problem(cp.Minimize(objective), constraints)
    return prob, M, (M0, K0, S0, half_sq, m0_sq)


def _solve(prob, M, solver: str) -> str | None:
    """Solve one SCA iteration's program; None when it is solved ("optimal_inaccurate" accepted,
    as the authors do), else why not."""
    import cvxpy as cp

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prob.solve(solver=solver)
    except cp.error.SolverError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if prob.status in ("optimal", "optimal_inaccurate") and M.value is not None else f"status {prob.status}"


def solve_sca(problem: MaskProblem, max_iter: int = 100, tol: float = 1e-3, penalty: float = 100.0,
              solver: str = "CLARABEL", tries: int = 1000, seed: int = 0, keep_best: bool = True) -> MaskSolution:
    """Successive convex approximation (SCA) of P^mask, as in the authors' `optMask`, from the greedy start.

    Parameter counts are divided by d_w (a = |pi|/d_w, b = psi/d_w), so the convex objective is f/d_w;
    `penalty` keeps the authors' raw-unit meaning (t^2 enters with weight penalty/d_w). Relax m to
    M in [0,1]^(N x J); with S_j = sum_n M_nj, variables K, eps >= 0, t >= 0:
      M a = b - eps;   K_nj >= M_nj^2 / S_j (one vectorised rotated second-order cone);
      K_nj S_j <= M_nj as 1/2(K'+S')^2 - 1/2 K'^2 - 1/2 S'^2 <= M, the concave part linearised at the
        previous iterate (K0 = M0/S0, so that iterate stays feasible). Deviation: K' = sqrt(N) K and
        S' = S/sqrt(N), not K, S: same product, balanced sizes; with the authors' split Clarabel stops
        (InsufficientProgress) on the first solve of the 20-device PreResNet-18 instance;
      sum M(1-M) <= t, -sum M^2 linearised: sum M - 2 sum M0*M + sum M0^2 <= t. The authors' code adds
        2 sum M0^2 (a shift of t's bound); this is the exact first-order expansion;
      minimise sum_n (max_j K_nj - a.K_n + eps_n) + (penalty/d_w) t^2.
    Stops at ||M - M0||_F <= tol or max_iter. A solver failure (exception or non-optimal status) ends
    the loop keeping the previous iterate (in the authors' code the unchanged iterate ends it);
    `notes` says so; `iterations` counts successful solves. Iterates are rounded at 0.5, devices over
    budget lose groups (`_repair`), and the true f is evaluated. keep_best (a deviation, default)
    returns the best rounding over all iterates, since the relaxation often drifts to a fractional
    point whose rounding is worse; keep_best=False uses the last iterate only, like the authors.
    The greedy start is returned when no rounding beats it (`fell_back` when the last was worse).
    """
    t0 = time.perf_counter()
    start = greedy_masks(problem, tries=tries, seed=seed)
    N, c = problem.N, float(np.sqrt(problem.N))
    prob, M, (M0, K0, S0, half_sq, m0_sq) = _sca_program(problem, penalty)

    current = start.masks.astype(float)
    best, best_value, best_iter, best_dropped = start.masks.copy(), start.objective, 0, 0
    last, last_value, last_dropped = best, best_value, 0
    notes, iterations = "", 0
    for it in range(1, max_iter + 1):
        counts = np.tile(current.sum(axis=0), (N, 1))
        k_prev = np.divide(current, counts, out=np.zeros_like(current), where=counts > 0)
        M0.value, K0.value, S0.value = current, c * k_prev, counts / c
        half_sq.value = 0.5 * (c * k_prev) ** 2 + 0.5 * (counts / c) ** 2
        m0_sq.value = float(np.sum(current ** 2))
        failure = _solve(prob, M, solver)
        if failure:
            notes = f"solver {solver} failed at iteration {it} ({failure}); kept the previous iterate"
            break
        iterations = it
        new = np.clip(M.value, 0.0, 1.0)
        step = np.linalg.norm(new - current)
        current = new
        last, last_dropped = _repair(problem, current >= 0.5)
        last_value = problem.objective(last)
        if keep_best and last_value < best_value:
            best, best_value, best_iter, best_dropped = last, last_value, it, last_dropped
        if step <= tol:
            break
    if not keep_best and last_value <= best_value:
        best, best_value, best_iter, best_dropped = last, last_value, iterations, last_dropped
    if keep_best and best_iter not in (0, iterations):
        notes = (notes + "; " if notes else "") + f"best rounding at iteration {best_iter} of {iterations}"
    return MaskSolution(best, best_value, "sca", iterations=iterations, greedy_objective=start.objective,
                        seconds=time.perf_counter() - t0, fell_back=best_iter == 0 and last_value > best_value,
                        repaired=best_dropped, last_objective=last_value, notes=notes)


def _enumerate(problem: MaskProblem, chunk: int = 1 << 15) -> np.ndarray:
    """Best mask over the product of each device's budget-feasible subsets of groups."""
    J = problem.J
    subsets = ((np.arange(1 << J)[:, None] >> np.arange(J)) & 1).astype(bool)
    used = subsets @ problem.group_sizes
    options = [subsets[used <= lim] for lim in problem._limit()]
    shape = tuple(len(o) for o in options)
    best_value, best = np.inf, None
    total = int(np.prod(shape))
    for lo in range(0, total, chunk):
        digits = np.unravel_index(np.arange(lo, min(lo + chunk, total)), shape)
        batch = np.stack([opt[d] for opt, d in zip(options, digits)], axis=1)
        values = _objectives(problem, batch)
        i = int(np.argmin(values))
        if values[i] < best_value:
            best_value, best = values[i], batch[i].copy()
    return best


def _milp(problem: MaskProblem, time_limit: float | None) -> np.ndarray:
    """Exact MILP (HiGHS), units divided by d_w. Binaries m_nj and z_jc (column j has exactly c
    members, c = 1..N); w_njc = m_nj AND z_jc in [0,1], so k_nj = sum_c w_njc / c; gamma_n >= k_nj.
    minimise sum_n gamma_n - sum_nj a_j k_nj - sum_nj a_j m_nj (+ the constant sum_n b_n)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    N, J = problem.N, problem.J
    a, cs = problem.group_sizes / problem.d_w, np.arange(1.0, N + 1)
    IM = np.arange(N * J).reshape(N, J)
    IZ = N * J + np.arange(J * N).reshape(J, N)
    IW = 2 * N * J + np.arange(N * J * N).reshape(N, J, N)
    IG = 2 * N * J + N * J * N + np.arange(N)
    families = [  # (columns (R, k), coefficients (R, k), lower, upper): R rows of k entries
        (IM, np.tile(a, (N, 1)), -np.inf, problem._limit()[:, None] / problem.d_w),      # budgets
        (IZ, np.ones((J, N)), 0.0, 1.0),                                                 # one count
        (np.hstack([IM.T, IZ]), np.hstack([np.ones((J, N)), -np.tile(cs, (J, 1))]), 0.0, 0.0),
        (np.concatenate([IW.transpose(1, 2, 0), IZ[..., None]], 2).reshape(J * N, N + 1),
         np.hstack([np.ones((J * N, N)), -np.tile(cs, J)[:, None]]), 0.0, 0.0),          # c members
        (np.concatenate([IW, IM[..., None]], 2).reshape(N * J, N + 1),
         np.hstack([np.ones((N * J, N)), -np.ones((N * J, 1))]), 0.0, 0.0),              # sum_c w = m
        (np.concatenate([IW, np.broadcast_to(IG[:, None, None], (N, J, 1))], 2).reshape(N * J, N + 1),
         np.hstack([np.tile(1 / cs, (N * J, 1)), -np.ones((N * J, 1))]), -np.inf, 0.0),  # k <= gamma
        (np.stack([IW, np.broadcast_to(IZ[None], IW.shape)], 3).reshape(-1, 2),
         np.tile([1.0, -1.0], (N * J * N, 1)), -np.inf, 0.0),                            # w <= z
    ]
    rows, cols, vals, lo, hi, r0 = [], [], [], [], [], 0
    for c_idx, coef, lower, upper in families:
        R = c_idx.shape[0]
        rows.append(np.repeat(np.arange(r0, r0 + R), c_idx.shape[1]))
        cols.append(c_idx.ravel()), vals.append(coef.ravel())
        lo.append(np.broadcast_to(lower, (R, 1)).ravel()), hi.append(np.broadcast_to(upper, (R, 1)).ravel())
        r0 += R
    nvar = IG[-1] + 1
    A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r0, nvar))
    cost = np.zeros(nvar)
    cost[IM] = -a
    cost[IW] = -a[None, :, None] / cs
    cost[IG] = 1.0
    integrality = np.zeros(nvar)
    integrality[: 2 * N * J] = 1
    options = {"disp": False, "mip_rel_gap": 0.0}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    res = milp(cost, constraints=LinearConstraint(A.tocsr(), np.concatenate(lo), np.concatenate(hi)),
               integrality=integrality, bounds=Bounds(0.0, 1.0), options=options)
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"exact MILP (N={N}, J={J}) not solved to optimality: {res.message}")
    return res.x[IM] > 0.5


def solve_exact(problem: MaskProblem, time_limit: float | None = None) -> MaskSolution:
    """The optimum of P^mask: enumeration when N*J <= 20, else the MILP above (RuntimeError if
    HiGHS stops before proving optimality, e.g. at `time_limit` seconds). ValueError when
    N*J*N exceeds 20000 (the MILP's w variables); use `solve_sca` there."""
    t0 = time.perf_counter()
    N, J = problem.N, problem.J
    if N * J <= ENUMERATE_MAX_ENTRIES:
        masks = _enumerate(problem)
    elif N * J * N <= MILP_MAX_BINARIES:
        masks = _milp(problem, time_limit)
    else:
        raise ValueError(f"N={N}, J={J}: too large for the exact solver (N*J={N * J} > {ENUMERATE_MAX_ENTRIES} "
                         f"for enumeration, N*J*N={N * J * N} > {MILP_MAX_BINARIES} for the MILP); use solve_sca")
    return MaskSolution(masks, problem.objective(masks), "exact", seconds=time.perf_counter() - t0)


def solve(problem: MaskProblem, method: str = "sca", **kw) -> MaskSolution:
    """Dispatch to greedy_masks / solve_sca / solve_exact by name."""
    solvers = {"greedy": greedy_masks, "sca": solve_sca, "exact": solve_exact}
    if method not in solvers:
        raise ValueError(f"method={method!r} is unknown; choose one of {', '.join(METHODS)}")
    return solvers[method](problem, **kw)
