"""Image rotation with Pillow (vHive "image_rotate").

At import a 512x512 RGB image is generated deterministically (Mandelbrot
set, gradients and a few drawn shapes, so it has no rotational symmetry)
and Pillow's PNG codec is warmed up; each call rotates the image by
event["angle"] degrees (counter-clockwise, canvas expanded to fit) and
re-encodes it as PNG in memory.

Event: {"angle": number (default 90)}.
Returns the PNG size, its sha256 and the rotated image's dimensions.
"""

import hashlib
import io

from PIL import Image, ImageDraw, PngImagePlugin  # noqa: F401  (PNG codec loaded at import)

SIZE = 512


def _build_image():
    red = Image.effect_mandelbrot((SIZE, SIZE), (-2.2, -1.4, 0.9, 1.4), 64)
    green = Image.linear_gradient("L").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    blue = Image.radial_gradient("L").resize((SIZE, SIZE), Image.Resampling.BILINEAR) \
        .transpose(Image.Transpose.ROTATE_90)
    img = Image.merge("RGB", (red, green, blue))
    draw = ImageDraw.Draw(img)
    draw.rectangle((32, 40, 180, 120), outline=(255, 255, 0), width=4)
    draw.ellipse((300, 330, 480, 470), fill=(20, 200, 90))
    draw.polygon([(60, 480), (200, 300), (240, 470)], fill=(230, 40, 160))
    for k in range(0, SIZE, 32):
        draw.line((k, 0, SIZE - 1, k), fill=(k % 256, 255 - k % 256, 128), width=1)
    img.load()
    return img


IMAGE = _build_image()


def _encode(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


# warm-up: exercise rotate (transpose and affine paths) and the PNG encoder
_encode(IMAGE.crop((0, 0, 16, 16)).rotate(90, expand=True))
_encode(IMAGE.crop((0, 0, 16, 16)).rotate(33, resample=Image.Resampling.BICUBIC, expand=True))


def handler(event, context):
    event = event if isinstance(event, dict) else {}
    angle = float(event.get("angle", 90))
    if not -3600 <= angle <= 3600:
        raise ValueError("angle out of range")
    rotated = IMAGE.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True)
    png = _encode(rotated)
    return {
        "angle": angle,
        "width": rotated.width,
        "height": rotated.height,
        "png_bytes": len(png),
        "sha256": hashlib.sha256(png).hexdigest(),
    }
