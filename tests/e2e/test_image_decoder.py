"""ImageDecoder (ONNX opset 20) end to end: a model of one ImageDecoder node
per pixel format, served by the real kiln and called with tritonclient,
against Pillow (which ONNX's reference implementation decodes with) and
against onnx.reference itself where its answer is the op's: JPEG
(baseline, progressive, grayscale), PNG (RGB, RGBA, palette, 16-bit),
WebP (lossless and lossy) and BMP (24-bit and palette), in RGB, BGR and
Grayscale. Broken, truncated, unknown and CMYK data are 400s naming the
input, and an image whose header declares more pixels than the request
memory bound allows is refused before it is decoded; the server keeps
serving throughout.
"""
import io
import struct
import zlib

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP
from tritonclient.utils import InferenceServerException

from conftest import KilnServer

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

FORMATS = {"rgb": "RGB", "bgr": "BGR", "gray": "Grayscale"}


def decoder_model(pixel_format):
    x = oh.make_tensor_value_info("image", TP.UINT8, [None])
    y = oh.make_tensor_value_info("pixels", TP.UINT8, [None, None, 1 if pixel_format == "Grayscale" else 3])
    node = oh.make_node("ImageDecoder", ["image"], ["pixels"], pixel_format=pixel_format)
    g = oh.make_graph([node], "decode", [x], [y])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 20)])


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgrepo")
    for name, fmt in FORMATS.items():
        d = root / name / "1"
        d.mkdir(parents=True)
        onnx.save(decoder_model(fmt), str(d / "model.onnx"))
        # One image per request: the input's dims are its whole shape.
        (root / name / "config.json").write_text(
            '{"max_batch_size": 0, "input": [{"name": "image", "data_type": "TYPE_UINT8", "dims": [-1]}]}')
    s = KilnServer(root, "--max-request-memory", str(64 << 20))
    yield s
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, s.text()


def picture(w=37, h=23, seed=0):
    """Gradients with noise: every channel varies, odd sizes."""
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], axis=2).astype(np.int32)
    img += r.integers(-40, 40, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img, fmt, **kw):
    b = io.BytesIO()
    img.save(b, format=fmt, **kw)
    return b.getvalue()


def png16(rgb16):
    """A 16-bit RGB PNG (Pillow writes none), chunk by chunk."""
    h, w, _ = rgb16.shape

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def images():
    rgb = Image.fromarray(picture())
    out = {
        "jpeg": encode(rgb, "JPEG", quality=90),
        "jpeg_progressive": encode(rgb, "JPEG", quality=75, progressive=True),
        "jpeg_gray": encode(rgb.convert("L"), "JPEG"),
        "jpeg_420_odd": encode(Image.fromarray(picture(51, 29, 1)), "JPEG", subsampling=2),
        "png": encode(rgb, "PNG"),
        "png_rgba": encode(Image.fromarray(np.dstack([picture(), picture(seed=2)[:, :, :1]])), "PNG"),
        "png_palette": encode(rgb.quantize(16), "PNG"),
        "png_gray": encode(rgb.convert("L"), "PNG"),
        "png_16bit": png16(picture().astype(np.uint16) * 257 + 3),
        "webp_lossless": encode(rgb, "WEBP", lossless=True),
        "webp_lossy": encode(rgb, "WEBP", quality=80),
        "bmp": encode(rgb, "BMP"),
        "bmp_palette": encode(rgb.quantize(32), "BMP"),
    }
    return out


IMAGES = images()


def expected(data, fmt):
    img = Image.open(io.BytesIO(data))
    if fmt == "Grayscale":
        return np.array(img.convert("L"))[:, :, None]
    a = np.array(img.convert("RGB"))
    return a[:, :, ::-1] if fmt == "BGR" else a


def infer(url, model, data):
    c = httpclient.InferenceServerClient(url)
    try:
        i = httpclient.InferInput("image", [len(data)], "UINT8")
        i.set_data_from_numpy(np.frombuffer(data, dtype=np.uint8), binary_data=True)
        return c.infer(model, [i]).as_numpy("pixels")
    finally:
        c.close()


@pytest.mark.parametrize("model", list(FORMATS))
@pytest.mark.parametrize("name", list(IMAGES))
def test_decodes_as_pillow(srv, name, model):
    got = infer(srv.url, model, IMAGES[name])
    want = expected(IMAGES[name], FORMATS[model])
    assert got.dtype == np.uint8 and got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["jpeg", "jpeg_progressive", "png", "webp_lossless", "bmp"])
@pytest.mark.parametrize("model", list(FORMATS))
def test_matches_onnx_reference(srv, name, model):
    from onnx.reference import ReferenceEvaluator
    ref = ReferenceEvaluator(decoder_model(FORMATS[model]))
    want = ref.run(None, {"image": np.frombuffer(IMAGES[name], dtype=np.uint8)})[0]
    np.testing.assert_array_equal(infer(srv.url, model, IMAGES[name]), want)


def cmyk_jpeg():
    return encode(Image.fromarray(picture()).convert("CMYK"), "JPEG")


def huge_png_header():
    """A valid PNG header declaring 30000 x 30000 pixels, and no pixels."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0))


@pytest.mark.parametrize("data,message", [
    (IMAGES["jpeg"][: len(IMAGES["jpeg"]) // 2], "broken JPEG"),
    (IMAGES["png"][: len(IMAGES["png"]) - 40], "broken PNG"),
    (IMAGES["webp_lossy"][: len(IMAGES["webp_lossy"]) // 2], "WebP"),
    (IMAGES["bmp"][:200], "truncated BMP"),
    (b"GIF89a" + bytes(64), "is not a JPEG, PNG, WebP or BMP image"),
    (b"", "is not a JPEG, PNG, WebP or BMP image"),
    (cmyk_jpeg(), "CMYK JPEG is not supported"),
    (huge_png_header(), "needs 2700000000 bytes, over the 67108864 bytes one request may use"),
])
def test_bad_images_are_400s_naming_the_input(srv, data, message):
    with pytest.raises(InferenceServerException) as e:
        infer(srv.url, "rgb", data)
    text = str(e.value)
    assert "400" in text or "Bad Request" in text or e.value.status() in ("400", 400), text
    assert message in text, text
    assert "encoded_stream" in text or "(ImageDecoder)" in text, text
    # Still serving.
    np.testing.assert_array_equal(infer(srv.url, "rgb", IMAGES["png"]), expected(IMAGES["png"], "RGB"))
