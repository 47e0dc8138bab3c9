"""Writes the text-line images (JPEG, quality 90) of calibration/ and evaluation/ (run once; the files are committed).

Synthetic but realistic input for a text-direction classifier: 1-4 words of the Apache-2.0
text in ../LICENSE, rendered with Pillow's built-in font (Aileron Regular, CC0) at 22-37 px,
darker text on a lighter tinted background (contrast from 40 grey levels up), often
blurred, with sensor-like noise; every second
image is turned by 180 degrees (file names end in _0 or _180: the expected class). The two sets
come from different seeds: no image is in both.

    python make_text_lines.py          # from this folder, with Pillow and numpy installed
"""
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

HERE = Path(__file__).resolve().parent
WORDS = (HERE.parent / "LICENSE").read_text().split()


def text_line(rng) -> Image.Image:
    n = int(rng.integers(1, 5))
    start = int(rng.integers(0, len(WORDS) - n))
    text = " ".join(WORDS[start:start + n])
    font = ImageFont.load_default(size=int(rng.integers(22, 38)))
    left, top, right, bottom = font.getbbox(text)
    mx, my = int(rng.integers(2, 10)), int(rng.integers(2, 8))
    bg = int(rng.integers(120, 256))
    fg = int(rng.integers(0, bg - 40))  # contrast from 40 grey levels up
    tint = tuple(int(np.clip(bg + d, 0, 255)) for d in rng.integers(-20, 21, size=3))
    img = Image.new("RGB", (right - left + 2 * mx, bottom - top + 2 * my), tint)
    ImageDraw.Draw(img).text((mx - left, my - top), text, font=font, fill=(fg, fg, fg))
    if rng.random() < 0.6:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 2.0))))
    noisy = np.asarray(img, np.float32) + rng.normal(0, rng.uniform(0, 10), size=(img.height, img.width, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).round().astype(np.uint8))


def write(folder: str, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    out = HERE / folder
    out.mkdir(exist_ok=True)
    for i in range(count):
        img, angle = text_line(rng), 180 * (i % 2)
        (img.rotate(180) if angle else img).save(out / f"{i:03d}_{angle}.jpg", quality=90)


if __name__ == "__main__":
    write("calibration", 32, seed=1)
    write("evaluation", 48, seed=2)
