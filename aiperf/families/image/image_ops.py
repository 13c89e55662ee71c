"""Decoding and augmenting one encoded image inside a tf.data pipeline (TensorFlow graph ops).

Training uses the ResNet reference's augmentation: a random-resized crop (10 attempts at a
window of 8-100 % of the area and aspect ratio 3/4-4/3, else the whole image), resized to the
target size, and a random horizontal flip. Evaluation resizes the centre crop that the usual
"resize the shorter side to size/0.875, crop the centre" would keep (cropping first, then
resizing, decodes and resizes fewer pixels for the same result). Randomness is stateless,
seeded per trial, epoch and image, so a trial's inputs are reproducible.

JPEGs (recognised by their first bytes, not their name) are decoded with the crop fused into
the decode, which skips the pixels outside the window (faster than decoding the whole image:
benchmarks/RESULTS.md). Anything else TensorFlow can read (PNG, GIF, BMP, WebP:
ImageNet holds a PNG named ``.JPEG``) is decoded whole and then cropped. CMYK and grayscale
JPEGs become RGB; 1x1 images and 4032x3024 photos work. A file that does not decode raises,
and the pipeline skips it (see :mod:`aiperf.families.image.stream_input`). Output: uint8 RGB at the
target size, as resident datasets are stored; the model's input layer scales it.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

JPEG_MAGIC = b"\xff\xd8\xff"
CROP_AREA = (0.08, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10
CENTRE_FRACTION = 0.875

# (height, width) of an image -> the crop window (top, left, height, width), all int32 tensors.
Window = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]]


def is_jpeg(data: tf.Tensor) -> tf.Tensor:
    return tf.equal(tf.strings.substr(data, 0, 3), JPEG_MAGIC)


def _decode_other(data: tf.Tensor) -> tf.Tensor:
    image = tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def decode_cropped(data: tf.Tensor, window: Window) -> tf.Tensor:
    """Decode ``data`` and keep ``window(height_width) -> (top, left, height, width)`` of it."""

    def jpeg() -> tf.Tensor:
        top, left, height, width = window(tf.image.extract_jpeg_shape(data)[:2])
        return tf.image.decode_and_crop_jpeg(data, tf.stack([top, left, height, width]), channels=3)

    def other() -> tf.Tensor:
        image = _decode_other(data)
        top, left, height, width = window(tf.shape(image)[:2])
        return tf.slice(image, tf.stack([top, left, 0]), tf.stack([height, width, 3]))

    image = tf.cond(is_jpeg(data), jpeg, other)
    image.set_shape([None, None, 3])
    return image


def random_window(seed: tf.Tensor) -> Window:
    """The random-resized crop's window for an image of a given (height, width)."""

    def window(size: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
            image_size=tf.concat([size, [3]], axis=0),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=seed,
            min_object_covered=0.1,
            aspect_ratio_range=CROP_ASPECT,
            area_range=CROP_AREA,
            max_attempts=CROP_ATTEMPTS,
            use_image_if_no_bounding_boxes=True,
        )
        return begin[0], begin[1], extent[0], extent[1]

    return window


def centre_window(target: tuple[int, int]) -> Window:
    """The centre crop with the target's aspect ratio, ``CENTRE_FRACTION`` of the image's shorter extent."""

    def window(size: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        h, w = tf.cast(size[0], tf.float32), tf.cast(size[1], tf.float32)
        scale = CENTRE_FRACTION * tf.minimum(h / target[0], w / target[1])
        height = tf.clip_by_value(tf.cast(tf.round(target[0] * scale), tf.int32), 1, size[0])
        width = tf.clip_by_value(tf.cast(tf.round(target[1] * scale), tf.int32), 1, size[1])
        return (size[0] - height) // 2, (size[1] - width) // 2, height, width

    return window


def _to_uint8(image: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    image = tf.saturate_cast(tf.round(image), tf.uint8)
    return tf.ensure_shape(image, [size[0], size[1], 3])


def train_image(data: tf.Tensor, size: tuple[int, int], seed: tf.Tensor) -> tf.Tensor:
    """Random-resized crop + horizontal flip of an encoded image, as uint8 ``size + (3,)``."""
    image = decode_cropped(data, random_window(seed))
    image = tf.image.resize(image, size, method="bilinear")
    image = tf.image.stateless_random_flip_left_right(image, seed=seed)
    return _to_uint8(image, size)


def eval_image(data: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    """Centre crop of an encoded image resized to ``size``, as uint8 ``size + (3,)``."""
    image = decode_cropped(data, centre_window(size))
    return _to_uint8(tf.image.resize(image, size, method="bilinear"), size)
