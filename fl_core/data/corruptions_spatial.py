"""Blur, weather and geometric corruptions of CIFAR-10-C, batched (helpers of `corruptions`).

Every function here takes a float32 batch `x` of shape (N, H, W, C), C = 1 or 3, values in
[0, 1], the severity (1-5) and a `numpy.random.Generator`, and returns a float array of the
same shape (not yet clipped). The public entry point, the list of names and the description of
where these differ from the reference live in `fl_core.data.corruptions`.

Building blocks, all vectorised over the batch:
  * `_gauss`: scipy.ndimage.gaussian_filter over H and W only (skimage's `gaussian` defaults:
    mode 'nearest', truncate 4);
  * `_conv`: small 2-D correlation with OpenCV's default border (reflect-101), via torch;
  * `_sample`: bilinear sampling at per-pixel coordinates with a chosen border rule;
  * `_zoom`: scipy's `zoom(order=1)` (align-corners bilinear) of the centre crop, via torch;
  * `_motion`: ImageMagick's MotionBlurImage kernel (one-sided Gaussian along a line, edge
    pixels repeated), images grouped by their rounded line so that each group is a few shifts;
  * `_plasma`: the diamond-square fractal of the reference, one per image.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

F32 = np.float32
LUMA = np.array([0.299, 0.587, 0.114], F32)  # OpenCV's RGB -> grey weights


def _gauss(x, sigma, mode="nearest", truncate=4.0):
    """Gaussian blur over the two image axes of an (N, H, W[, C]) array."""
    if sigma <= 0:
        return x
    from scipy import ndimage  # here, not at import: scipy adds ~15 MB to every process that loads the catalog

    sig = (0, sigma, sigma) + ((0,) if x.ndim == 4 else ())
    return ndimage.gaussian_filter(x, sig, mode=mode, truncate=truncate)


def _conv(x, kernel):
    """Correlate every channel of (N, H, W, C) with a small 2-D kernel, reflect-101 border."""
    n, h, w, c = x.shape
    kh, kw = kernel.shape
    t = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).reshape(n * c, 1, h, w)
    t = F.pad(t, (kw // 2, kw // 2, kh // 2, kh // 2), mode="reflect")
    out = F.conv2d(t, torch.from_numpy(kernel.astype(F32))[None, None])
    return out.reshape(n, c, h, w).numpy().transpose(0, 2, 3, 1)


def _fold(i, size, mode):
    """Bring integer indices (at most one image size outside) back inside by the border rule."""
    if mode == "mirror":  # d c b | a b c d | c b a   (OpenCV reflect-101)
        i = (size - 1) - np.abs((size - 1) - np.abs(i))
    elif mode == "reflect":  # d c b a | a b c d | d c b a   (scipy)
        i = np.where(i < 0, -1 - i, i)
        i = np.minimum(i, 2 * size - 1 - i)
    return np.clip(i, 0, size - 1)


def _sample(x, rows, cols, mode):
    """Bilinear samples of x (N, H, W, C) at float coordinates rows, cols of shape (N, H, W)."""
    n, h, w, c = x.shape
    flat = x.reshape(n, h * w, c)
    r0, c0 = np.floor(rows), np.floor(cols)
    fr, fc = (rows - r0)[..., None].astype(F32), (cols - c0)[..., None].astype(F32)
    r0, c0 = r0.astype(np.int32), c0.astype(np.int32)
    out = np.zeros_like(x)
    for dr, wr in ((0, 1 - fr), (1, fr)):
        ri = _fold(r0 + dr, h, mode) * w
        for dc, wc in ((0, 1 - fc), (1, fc)):
            idx = (ri + _fold(c0 + dc, w, mode)).reshape(n, h * w, 1)
            out += wr * wc * np.take_along_axis(flat, idx, axis=1).reshape(n, h, w, c)
    return out


def _zoom(x, factor):
    """The reference's clipped_zoom: zoom the centre crop by `factor`, keep the centre H x W."""
    n, h, w, c = x.shape
    ch, cw = int(np.ceil(h / factor)), int(np.ceil(w / factor))
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = x[:, top:top + ch, left:left + cw].transpose(0, 3, 1, 2).reshape(n * c, 1, ch, cw)
    oh, ow = int(round(ch * factor)), int(round(cw * factor))
    z = F.interpolate(torch.from_numpy(np.ascontiguousarray(crop)), size=(oh, ow),
                      mode="bilinear", align_corners=True).numpy()
    row0, col0 = (oh - h) // 2, (ow - w) // 2
    return z.reshape(n, c, oh, ow)[:, :, row0:row0 + h, col0:col0 + w].transpose(0, 2, 3, 1)


def _motion(x, radius, sigma, angles):
    """ImageMagick motion blur of each image along its own angle (degrees), edge-extended."""
    width = 2 * int(radius) + 1
    k = np.exp(-np.arange(width) ** 2 / (2.0 * sigma ** 2))
    k = (k / k.sum()).astype(F32)
    a = np.deg2rad(angles)[:, None]
    steps = np.arange(width)[None, :]
    dy = np.ceil(steps * np.sin(a) - 0.5).astype(np.int64)  # row offset read by tap i
    dx = np.ceil(steps * np.cos(a) - 0.5).astype(np.int64)
    n, h, w, _ = x.shape
    p = width
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)), mode="edge")
    keys, group = np.unique(np.concatenate([dy, dx], 1), axis=0, return_inverse=True)
    out = np.empty_like(x)
    for g, key in enumerate(keys):
        members = np.flatnonzero(group.ravel() == g)
        sub = xp[members]
        acc = np.zeros((len(members), h, w, x.shape[3]), F32)
        for i in range(width):
            r, q = p + key[i], p + key[width + i]
            acc += k[i] * sub[:, r:r + h, q:q + w]
        out[members] = acc
    return out


def _plasma(n, size, decay, rng):
    """n diamond-square height maps (n, S, S) in [0, 1], S the power of two >= size."""
    s = 1 << max(int(np.ceil(np.log2(max(size, 2)))), 1)
    m = np.zeros((n, s, s))
    step, wibble = s, 100.0

    def noisy_mean(a):
        return a / 4 + wibble * rng.uniform(-wibble, wibble, a.shape)

    while step >= 2:
        half = step // 2
        corners = m[:, 0:s:step, 0:s:step]
        acc = corners + np.roll(corners, -1, axis=1)
        acc += np.roll(acc, -1, axis=2)
        m[:, half:s:step, half:s:step] = noisy_mean(acc)
        dr = m[:, half:s:step, half:s:step]
        ul = m[:, 0:s:step, 0:s:step]
        m[:, 0:s:step, half:s:step] = noisy_mean(dr + np.roll(dr, 1, axis=1)
                                                  + ul + np.roll(ul, -1, axis=2))
        m[:, half:s:step, 0:s:step] = noisy_mean(dr + np.roll(dr, 1, axis=2)
                                                  + ul + np.roll(ul, -1, axis=1))
        step //= 2
        wibble /= decay
    m -= m.min(axis=(1, 2), keepdims=True)
    return m / m.max(axis=(1, 2), keepdims=True)


def _grey_of(colour, channels):
    """An RGB colour (3,) in [0, 1], as the image's channels (its luminance for grey images)."""
    colour = np.asarray(colour, F32)
    return colour if channels == 3 else np.array([colour @ LUMA], F32)


# ----------------------------------------------------------------------------- blurs

def gaussian_blur(x, s, rng):
    return _gauss(x, [.4, .6, 0.7, .8, 1][s - 1])


def glass_blur(x, s, rng):
    sigma, delta, iterations = [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2),
                                (0.4, 1, 2)][s - 1]
    n, h, w, c = x.shape
    x = np.floor(np.clip(_gauss(x, sigma), 0, 1) * 255 + 1e-3).astype(F32) / 255
    # The reference "swaps" x[r, c] with x[r + dy, c + dx] (dy, dx in [-delta, delta)) while
    # sweeping r, c downwards, but its tuple swap of numpy views only copies: each pixel of the
    # sweep takes the still-original value of a neighbour up/left or itself. Reproduced as one
    # gather per iteration (with delta = 1, reads never hit an already written pixel).
    rows = np.arange(delta + 1, h - delta + 1)
    cols = np.arange(delta + 1, w - delta + 1)
    for _ in range(iterations):
        d = rng.integers(-delta, delta, size=(2, n, len(rows), len(cols)))
        src = x[np.arange(n)[:, None, None], rows[None, :, None] + d[0], cols[None, None] + d[1]]
        x = x.copy()
        x[:, delta + 1:h - delta + 1, delta + 1:w - delta + 1] = src
    return _gauss(x, sigma)


def defocus_blur(x, s, rng):
    radius, alias = [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)][s - 1]
    span = np.arange(-8, 9)
    yy, xx = np.meshgrid(span, span)
    disk = (xx ** 2 + yy ** 2 <= radius ** 2).astype(np.float64)
    disk /= disk.sum()
    g = np.exp(-np.arange(-1, 2) ** 2 / (2 * alias ** 2))
    from scipy import ndimage

    kernel = ndimage.correlate(disk, np.outer(g, g) / g.sum() ** 2, mode="mirror")
    keep = np.flatnonzero(kernel.any(0))  # symmetric: the same support on both axes
    kernel = kernel[keep[0]:keep[-1] + 1, keep[0]:keep[-1] + 1]
    return _conv(x, kernel)


def motion_blur(x, s, rng):
    radius, sigma = [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)][s - 1]
    return _motion(x, radius, sigma, rng.uniform(-45, 45, len(x)))


def zoom_blur(x, s, rng):
    top = [1.06, 1.11, 1.16, 1.21, 1.26][s - 1]
    factors = np.arange(1, top, 0.01)  # float arange as in the reference: 7/12/16/21/26 zooms
    out = x.copy()
    for z in factors:
        out += _zoom(x, z)
    return out / (len(factors) + 1)


# ----------------------------------------------------------------------------- weather

def snow(x, s, rng):
    loc, scale, zoom, thresh, radius, sigma, keep = [
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)][s - 1]
    n, h, w, c = x.shape
    flakes = rng.normal(loc, scale, (n, h, w, 1)).astype(F32)
    flakes = _zoom(flakes, zoom)
    flakes[flakes < thresh] = 0
    flakes = np.floor(np.clip(flakes, 0, 1) * 255).astype(F32) / 255
    flakes = _motion(flakes, radius, sigma, rng.uniform(-135, -45, n))
    grey = x if c == 1 else (x @ LUMA)[..., None]
    x = keep * x + (1 - keep) * np.maximum(x, grey * 1.5 + 0.5)
    return x + flakes + flakes[:, ::-1, ::-1]


# Mean RGB and spread of the five frost photographs the reference draws from, measured on the
# photographs (hendrycks/robustness, frost1-5, shrunk by 0.2 as the reference does).
FROST_PHOTOS = ((78, 149, 166, 17), (201, 205, 215, 19), (201, 205, 215, 19),
                (138, 153, 165, 22), (112, 123, 135, 36))


def frost(x, s, rng):
    weight, ice = [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)][s - 1]
    n, h, w, c = x.shape
    photo = np.asarray(FROST_PHOTOS, F32)[rng.integers(5, size=n)]
    tex = _plasma(n, max(h, w), 1.6, rng)[:, :h, :w].astype(F32)
    tex = (tex - tex.mean((1, 2), keepdims=True)) / (tex.std((1, 2), keepdims=True) + 1e-6)
    layer = np.clip(photo[:, None, None, :3] + photo[:, None, None, 3:] * tex[..., None], 0, 255)
    if c == 1:
        layer = layer @ LUMA[:, None]
    return weight * x + ice * layer / 255


def fog(x, s, rng):
    amount, decay = [(.2, 3), (.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)][s - 1]
    n, h, w, _ = x.shape
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    x = x + amount * _plasma(n, max(h, w), decay, rng)[:, :h, :w, None].astype(F32)
    return x * peak / (peak + amount)


def spatter(x, s, rng):
    loc, scale, sigma, thresh, strength, mud = [
        (0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0), (0.65, 0.3, 1, 0.69, 0.5, 0),
        (0.65, 0.1, 0.7, 0.69, 0.6, 1), (0.65, 0.1, 0.5, 0.68, 0.6, 1)][s - 1]
    n, h, w, c = x.shape
    liquid = _gauss(rng.normal(loc, scale, (n, h, w)).astype(F32), sigma)
    liquid[liquid < thresh] = 0
    if mud:
        m = _gauss((liquid > thresh).astype(F32), strength)
        m[m < 0.8] = 0
        m = m[..., None]
        return x * (1 - m) + m * _grey_of((63 / 255, 42 / 255, 20 / 255), c)
    # Water: distance to the drop outlines, truncated at 20 px, box-blurred, equalised, embossed.
    wet = liquid > 0
    from scipy import ndimage

    edges = wet & ~ndimage.binary_erosion(wet, structure=_CROSS)  # outline (for Canny)
    dist = _chamfer(edges)
    box = np.full((3, 3), 1 / 9, F32)
    dist = _conv(np.minimum(dist, 20).astype(F32)[..., None], box)[..., 0]
    dist = _equalise(dist.astype(np.uint8))
    emboss = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], F32)
    dist = np.clip(np.rint(_conv(dist[..., None], emboss)), 0, 255)
    dist = _conv(dist, box)[..., 0]
    m = np.floor(liquid * 255) * dist
    m = m / np.maximum(m.max(axis=(1, 2), keepdims=True), 1e-12) * strength
    return x + m[..., None] * _grey_of((175 / 255, 238 / 255, 238 / 255), c)


# The 4-neighbourhood in each image's own plane (no neighbour across the batch axis).
_CROSS = np.zeros((3, 3, 3), bool)
_CROSS[1] = [[0, 1, 0], [1, 1, 1], [0, 1, 0]]


def _chamfer(edges):
    """OpenCV's distanceTransform(DIST_L2, mask 5) to the True pixels of each (N, H, W) image.

    Two raster passes of the 5x5 chamfer mask (steps 1, 1.4, 2.1969); the in-row step is a
    running min-plus scan (a cumulative minimum), the other taps come from earlier rows.
    """
    a, b, c = 1.0, 1.4, 2.1969
    n, h, w = edges.shape
    big = 1e4
    d = np.full((n, h + 4, w + 4), big, F32)
    d[:, 2:-2, 2:-2] = np.where(edges, 0, big)
    ramp = a * np.arange(w, dtype=F32)
    for rows, sign in ((range(2, h + 2), 1), (range(h + 1, 1, -1), -1)):
        for r in rows:
            p1, p2 = d[:, r - sign], d[:, r - 2 * sign]
            cand = np.minimum.reduce([p1[:, 2:-2] + a, p1[:, 1:-3] + b, p1[:, 3:-1] + b,
                                      p1[:, :-4] + c, p1[:, 4:] + c, p2[:, 1:-3] + c,
                                      p2[:, 3:-1] + c, d[:, r, 2:-2]])
            if sign < 0:
                cand = cand[:, ::-1]
            cand = ramp + np.minimum.accumulate(cand - ramp, axis=1)
            d[:, r, 2:-2] = cand if sign > 0 else cand[:, ::-1]
    return d[:, 2:-2, 2:-2]


def _equalise(img):
    """OpenCV's equalizeHist for each uint8 image of (N, H, W), returned as float32."""
    n = len(img)
    hist = np.bincount((np.arange(n)[:, None, None] * 256 + img).ravel(),
                       minlength=n * 256).reshape(n, 256)
    cdf = np.cumsum(hist, axis=1).astype(np.float64)
    total = cdf[:, -1:]
    first = np.where(cdf > 0, cdf, np.inf).min(axis=1, keepdims=True)
    span = np.maximum(total - first, 1)
    lut = np.clip(np.rint((cdf - first) * 255 / span), 0, 255)
    lut = np.where(total == first, np.arange(256), lut)  # a constant image stays as it is
    return np.take_along_axis(lut, img.reshape(n, -1), axis=1).reshape(img.shape).astype(F32)


def elastic_transform(x, s, rng):
    size = min(x.shape[1:3])
    alpha, smooth, jitter = (size * f for f in [(0, 0, 0.08), (0.05, 0.2, 0.07),
                                                 (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                                                 (0.1, 0.03, 0.03)][s - 1])
    n, h, w, _ = x.shape
    # Random affine: three points around the centre, each moved by up to `jitter` pixels.
    centre = np.array([h // 2, w // 2], np.float64)
    half = size // 3
    src = np.array([centre + half, [centre[0] + half, centre[1] - half], centre - half])
    dst = src + rng.uniform(-jitter, jitter, (n, 3, 2))
    ones = np.ones((3, 1))
    affine = np.linalg.solve(np.hstack([src, ones])[None], dst)  # (n, 3, 2): [x y 1] -> [x' y']
    inv = np.linalg.inv(affine[:, :2, :].transpose(0, 2, 1)).astype(F32)[:, :, :, None, None]
    yy, xx = np.meshgrid(np.arange(h, dtype=F32), np.arange(w, dtype=F32), indexing="ij")
    ox = xx[None] - affine[:, 2, 0, None, None].astype(F32)
    oy = yy[None] - affine[:, 2, 1, None, None].astype(F32)
    src_xy = (inv[:, 0, 0] * ox + inv[:, 0, 1] * oy, inv[:, 1, 0] * ox + inv[:, 1, 1] * oy)
    x = _sample(x, src_xy[1], src_xy[0], "mirror")
    # Smooth random displacement field.
    dx = _gauss(rng.uniform(-1, 1, (n, h, w)), smooth, "reflect", 3) * alpha
    dy = _gauss(rng.uniform(-1, 1, (n, h, w)), smooth, "reflect", 3) * alpha
    return _sample(x, yy[None] + dy, xx[None] + dx, "reflect")
