#!/usr/bin/python3
"""Builds the image-processor fixtures (tests/fixtures/images/) with Pillow and numpy, the reference
for src/vision/image.cpp (tests/vision/image_test.cpp).

  /usr/bin/python3 tools/make_image_fixtures.py [SKIMAGE_DATA_DIR]

Debian 12's python3-pil (Pillow 9.4) and python3-numpy; the photograph is scikit-image's
coffee.png from Debian's python3-skimage package (`apt-get download python3-skimage && dpkg -x`,
skimage/data/coffee.png, 600x400, public domain), cropped. Writes the input files (PNG and JPEG
variants, and a few small PNGs written byte by byte for the colour types and bit depths Pillow's
encoder does not produce) and references.safetensors:
  decoded/NAME     U8 [H, W, 3]   Image.open(NAME) through transformers' convert_to_rgb
  resized/CASE     U8 [h, w, 3]   the decoded image after the processor's resize (Pillow BICUBIC)
  pixel_values/CASE F32 [P, 3, 14, 14] (three of the cases), grid_thw/CASE I64 [3]
                                   what Kimi_K25ImageProcessor gives (pad with zeros, rescale,
                                   normalise with mean = std = 0.5, patches in row-major order),
                                   with navit_resize in the aspect-keeping orientation
  plain_resize/NAME U8             Pillow BICUBIC resizes to other sizes, for the resampler alone
The processor cases' parameters are in the file's metadata (JSON), so the test reads them.
torch is not used: the resize is Pillow's (torchvision's antialiased uint8 bicubic follows it) and
the normalisation is transformers' fused one, (x - 127.5) / 127.5 in float32.
"""
import io
import json
import math
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "images")
SK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sk/x/usr/lib/python3/dist-packages/skimage/data"


def convert_to_rgb(image):  # transformers.image_transforms.convert_to_rgb
    if image.mode == "RGB":
        return image
    image_rgba = image.convert("RGBA")
    background = Image.new("RGBA", image_rgba.size, (255, 255, 255))
    return Image.alpha_composite(background, image_rgba).convert("RGB")


def navit_resize(width, height, patch_size, merge_kernel_size, in_patch_limit,
                 patch_limit_on_one_side):
    # transformers' navit_resize with width and height where they belong (its _preprocess passes
    # them swapped; the Kimi remote code and vLLM keep the aspect ratio).
    npw = max(1.0, width // patch_size)
    nph = max(1.0, height // patch_size)
    scale = min(1.0, math.sqrt(in_patch_limit / (npw * nph)),
                patch_limit_on_one_side * patch_size / width,
                patch_limit_on_one_side * patch_size / height)
    new_w, new_h = max(1, int(width * scale)), max(1, int(height * scale))
    new_w = min(new_w, patch_limit_on_one_side * patch_size)
    new_h = min(new_h, patch_limit_on_one_side * patch_size)
    f = merge_kernel_size * patch_size
    return (new_w, new_h), ((f - new_w % f) % f + new_w, (f - new_h % f) % f + new_h)


def process(rgb, p):
    (w, h), (pw, ph) = navit_resize(rgb.width, rgb.height, p["patch_size"],
                                    p["merge_kernel_size"], p["in_patch_limit"],
                                    p["patch_limit_on_one_side"])
    resized = rgb if (w, h) == rgb.size else rgb.resize((w, h), Image.BICUBIC)
    arr = np.zeros((ph, pw, 3), np.uint8)
    arr[:h, :w] = np.asarray(resized)
    x = (arr.astype(np.float32).transpose(2, 0, 1) - np.float32(127.5)) / np.float32(127.5)
    ps = p["patch_size"]
    gh, gw = ph // ps, pw // ps
    patches = x.reshape(3, gh, ps, gw, ps).transpose(1, 3, 0, 2, 4).reshape(-1, 3, ps, ps)
    return np.asarray(resized), np.ascontiguousarray(patches), np.array([1, gh, gw], np.int64)


def write_safetensors(path, tensors, metadata):
    codes = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def png_bytes(w, h, depth, ctype, rows, extra=b""):
    """A PNG written by hand: rows are the raw scanlines without filter bytes."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    raw = b"".join(b"\x00" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
            + b"".join(chunk(t, d) for t, d in extra) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(38)
    coffee = Image.open(os.path.join(SK, "coffee.png")).convert("RGB")
    photo = coffee.crop((215, 115, 385, 235))  # 170 x 120, the cup's rim and saucer
    small = coffee.crop((260, 140, 356, 204))  # 96 x 64
    files = {}

    def save(name, im, **kw):
        buf = io.BytesIO()
        im.save(buf, **kw)
        files[name] = buf.getvalue()

    save("photo.png", photo, format="PNG")
    save("photo.jpg", photo, format="JPEG", quality=90)
    save("photo_progressive.jpg", photo, format="JPEG", quality=85, progressive=True,
         subsampling=0)
    save("gray.jpg", small.convert("L"), format="JPEG", quality=90)
    a = np.asarray(small)
    yy, xx = np.mgrid[0:64, 0:96]
    alpha = ((xx * 5 + yy * 3) % 256).astype(np.uint8)  # every alpha value, 0 and 255 included
    save("rgba.png", Image.fromarray(np.dstack([a, alpha]), "RGBA"), format="PNG")
    pal = small.quantize(48)
    trns = bytes((i * 37) % 256 if i % 3 else 255 for i in range(48))
    save("palette.png", pal, format="PNG", transparency=trns)
    g = np.asarray(small.convert("L"))
    save("gray_trns.png", Image.fromarray(g, "L"), format="PNG", transparency=int(g[10, 10]))
    save("gray_alpha.png", Image.fromarray(np.dstack([g, alpha]), "LA"), format="PNG")
    # Byte by byte: 16-bit gray (Pillow: mode I, clipped to 255 on conversion), 16-bit RGB and
    # gray+alpha (the high byte of each sample), 2-bit gray with a tRNS key (Pillow compares the
    # key with the scaled value) and 1-bit gray.
    w, h = 40, 30
    v16 = rng.integers(0, 700, size=(h, w)).astype(">u2")
    files["gray16.png"] = png_bytes(w, h, 16, 0, [r.tobytes() for r in v16],
                                    [(b"tRNS", struct.pack(">H", int(v16[3, 4])))])
    rgb16 = rng.integers(0, 65536, size=(h, w, 3)).astype(">u2")
    files["rgb16.png"] = png_bytes(w, h, 16, 2, [r.tobytes() for r in rgb16])
    la16 = rng.integers(0, 65536, size=(h, w, 2)).astype(">u2")
    files["gray_alpha16.png"] = png_bytes(w, h, 16, 4, [r.tobytes() for r in la16])
    v2 = rng.integers(0, 4, size=(h, w)).astype(np.uint8)
    packed2 = [bytes(int(r[i] << 6 | r[i + 1] << 4 | r[i + 2] << 2 | r[i + 3]) for i in range(0, w, 4))
               for r in v2]
    files["gray2_trns.png"] = png_bytes(w, h, 2, 0, packed2, [(b"tRNS", b"\x00\x00")])
    v1 = rng.integers(0, 2, size=(h, w)).astype(np.uint8)
    files["gray1.png"] = png_bytes(w, h, 1, 0, [np.packbits(r).tobytes() for r in v1])

    tensors = []
    decoded = {}
    for name, data in sorted(files.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        im = Image.open(io.BytesIO(data))
        im.load()
        rgb = convert_to_rgb(im)
        decoded[name] = rgb
        tensors.append(("decoded/" + name, np.asarray(rgb)))

    base = dict(patch_size=14, merge_kernel_size=2, in_patch_limit=16384,
                patch_limit_on_one_side=512)
    cases = {
        # no resize: within every limit, only padding
        "gray1_default": ("gray1.png", base),
        # the patch budget scales 170 x 120 to 69 x 48 (x by 2.464, y by 2.5)
        "photo_budget16": ("photo.png", dict(base, in_patch_limit=16)),
        "jpeg_budget16": ("photo.jpg", dict(base, in_patch_limit=16)),
        # the per-side limit: 8 patches a side, 170 x 120 -> 112 x 79
        "photo_side8": ("photo.png", dict(base, patch_limit_on_one_side=8)),
        "rgba_budget12": ("rgba.png", dict(base, in_patch_limit=12)),
    }
    meta = {}
    for case, (name, p) in cases.items():
        resized, pv, grid = process(decoded[name], p)
        tensors += [("resized/" + case, resized), ("grid_thw/" + case, grid)]
        if case in ("gray1_default", "photo_budget16", "rgba_budget12"):  # the others: size
            tensors.append(("pixel_values/" + case, pv))
        meta[case] = dict(p, image=name)
    # Sizes for the resampler alone: strong and mild factors, one axis kept (one pass only).
    plain = {"photo_37x111": ("photo.png", (37, 111)), "photo_169x1": ("photo.png", (169, 1)),
             "photo_7x5": ("photo.png", (7, 5)), "rgba_95x63": ("rgba.png", (95, 63)),
             "rgba_96x20": ("rgba.png", (96, 20)), "rgba_30x64": ("rgba.png", (30, 64))}
    for case, (name, size) in plain.items():
        tensors.append(("plain_resize/" + case, np.asarray(decoded[name].resize(size, Image.BICUBIC))))
        meta["plain_" + case] = dict(image=name, width=size[0], height=size[1])
    write_safetensors(os.path.join(OUT, "references.safetensors"), tensors,
                      {"cases": json.dumps(meta, sort_keys=True)})
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"make_image_fixtures.py: {len(files)} images, {len(tensors)} tensors, {total} bytes")


if __name__ == "__main__":
    main()
