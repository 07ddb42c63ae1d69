"""TensorBoard event files read without TensorFlow: the TFRecord framing and the few protobuf fields
of ``Event`` / ``Summary`` that hold scalars, decoded here with every CRC checked and every size bounded.

TFRecord (tensorflow/core/lib/io/record_writer.cc): ``uint64 length | uint32 masked_crc32c(length) |
data | uint32 masked_crc32c(data)``, little-endian; ``masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8``.
Event (tensorflow/core/util/event.proto): 1 wall_time (double), 2 step (int64), 3 file_version,
5 summary. Summary.Value (tensorflow/core/framework/summary.proto): 1 tag, 2 simple_value (float),
8 tensor (TensorProto: 1 dtype, 4 tensor_content, 5 float_val, 6 double_val), as torch's and
tensorboardX's ``SummaryWriter`` and HF ``TensorBoardCallback`` write them.
"""

from __future__ import annotations

import struct
from pathlib import Path

from model_zoo import files
from porting.intake import IntakeError
from porting.intake.curve import Curve

MAX_TB_BYTES = 64 << 20        # scalars of a long run: a few MB; images and histograms are what make more
MAX_RECORD_BYTES = 4 << 20     # one Event; a scalar event is < 100 bytes
MAX_PROTO_DEPTH = 4            # Event > Summary > Value > TensorProto

# tag -> series, first match wins: HF TensorBoardCallback ("train/*"), port train (train/lr), Megatron
# ("lm loss", "grad-norm", "learning-rate"), common hand-written names.
TAGS = {
    "loss": ("train/loss", "loss", "train_loss", "loss/train", "train/lm_loss", "lm loss"),
    "grad_norm": ("train/grad_norm", "grad_norm", "grad-norm", "train/grad-norm"),
    "lr": ("train/learning_rate", "train/lr", "learning_rate", "lr", "learning-rate"),
    "tokens": ("train/num_input_tokens_seen", "tokens", "num_input_tokens_seen"),
}


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1   # CRC-32C (Castagnoli), reflected
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(raw: bytes, path: Path):
    """Yield each record's data; one error line for a bad CRC or a record past the bound."""
    pos, n = 0, len(raw)
    while pos < n:
        if n - pos < 12:
            raise IntakeError(f"{path}: record at byte {pos}: {n - pos} stray bytes, expected a 12-byte header; the file "
                              "was cut while written (copy it after the run ends)")
        header = raw[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        if masked_crc(header) != hcrc:
            raise IntakeError(f"{path}: record at byte {pos}: length CRC mismatch; the event file is corrupt")
        if length > MAX_RECORD_BYTES:
            raise IntakeError(f"{path}: record at byte {pos}: {length:,} bytes, more than the {MAX_RECORD_BYTES:,} a "
                              "scalar event needs; not an event file port reads")
        end = pos + 12 + length
        if end + 4 > n:
            raise IntakeError(f"{path}: record at byte {pos}: cut short ({n - pos - 12} of {length + 4} bytes); the file "
                              "was cut while written (copy it after the run ends)")
        data = raw[pos + 12:end]
        (dcrc,) = struct.unpack("<I", raw[end:end + 4])
        if masked_crc(data) != dcrc:
            raise IntakeError(f"{path}: record at byte {pos}: data CRC mismatch; the event file is corrupt")
        yield pos, data
        pos = end + 4


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out, shift = 0, 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        b = buf[i]
        out |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return out, i
        shift += 7


def fields(buf: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of one protobuf message: ints, 8/4-byte blobs, or bytes."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            ln, i = _varint(buf, i)
            v, i = buf[i:i + ln], i + ln
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        if i > len(buf):
            raise ValueError("field past the end")
        out.append((num, wt, v))
    return out


# TensorProto's value fields and the wire types protobuf may give them (tensor_content: bytes; float_val and
# double_val: one fixed32/fixed64, or packed into bytes)
TENSOR_WIRE = {4: (2,), 5: (5, 2), 6: (1, 2)}


def _tensor_scalar(buf: bytes) -> float | None:
    dtype, vals = 1, []
    for num, wt, v in fields(buf):
        if num in TENSOR_WIRE and wt not in TENSOR_WIRE[num]:
            # a float field with another wire type (a varint where a float belongs) is not a TensorProto
            raise ValueError(f"TensorProto field {num} with wire type {wt}, expected {TENSOR_WIRE[num]}")
        if num == 1 and wt == 0:
            dtype = v
        elif num == 4:
            vals.append(struct.unpack("<f" if dtype == 1 else "<d", v[:4 if dtype == 1 else 8])[0] if v else None)
        elif num == 5:
            vals.append(struct.unpack("<f", v[:4])[0])
        elif num == 6:
            vals.append(struct.unpack("<d", v[:8])[0])
    return vals[0] if len(vals) == 1 and dtype in (1, 2) else None


def _scalars(event: bytes) -> tuple[int, list[tuple[str, float]]]:
    step, out = 0, []   # proto3 leaves a zero step out of the encoding: absent means step 0
    for num, wt, v in fields(event):
        if num == 2 and wt == 0:
            step = v
        elif num == 5 and wt == 2:
            for vnum, vwt, value in fields(v):
                if vnum != 1 or vwt != 2:
                    continue
                tag, x = None, None
                for fnum, fwt, f in fields(value):
                    if fnum in (1, 2, 8) and fwt != {1: 2, 2: 5, 8: 2}[fnum]:
                        raise ValueError(f"Summary.Value field {fnum} with wire type {fwt}")
                    if fnum == 1:
                        tag = f.decode("utf-8", "replace")
                    elif fnum == 2 and fwt == 5:
                        x = struct.unpack("<f", f)[0]
                    elif fnum == 8 and fwt == 2:
                        x = _tensor_scalar(f)
                if tag is not None and x is not None:
                    out.append((tag, x))
    return step, out


def read_scalars(path: Path, loss_tag: str | None = None) -> Curve:
    """The training curve of an event file: loss, grad norm, learning rate (and tokens) by step.

    ``loss_tag`` names the scalar that holds the training loss when the run logged it under a name of its
    own (``Loss/train``, ``strict/foo``); without it the names of ``TAGS`` are recognised. A step logged
    twice under one tag (a resumed run re-logs its steps) keeps the later value, as TensorBoard shows it
    after purging the orphaned events of a restart, and is counted in the curve's skipped rows."""
    raw = _read_bytes(path)
    wanted = dict(TAGS, loss=(loss_tag,)) if loss_tag is not None else TAGS
    series: dict[str, dict[int, float]] = {k: {} for k in TAGS}
    seen_tags: set[str] = set()
    repeats = 0
    for pos, data in records(raw, path):
        try:
            step, scalars = _scalars(data)
        except (ValueError, struct.error) as e:
            raise IntakeError(f"{path}: record at byte {pos}: not a TensorBoard Event ({e}); the file is corrupt or "
                              "not an event file") from None
        for tag, x in scalars:
            seen_tags.add(tag)
            for name, tags in wanted.items():
                hit = tag == tags[0] if name == "loss" and loss_tag is not None else tag.lower() in tags
                if hit:
                    repeats += name == "loss" and step in series[name]
                    series[name][step] = x
    if not series["loss"]:
        found = ", ".join(sorted(seen_tags)[:12]) or "none"
        if loss_tag is not None:
            raise IntakeError(f"{path}: no scalar tagged {loss_tag!r} (--loss-tag); tags found: {found}")
        raise IntakeError(f"{path}: no training-loss scalar; tags found: {found}; expected one of "
                          f"{', '.join(TAGS['loss'])}, or name the loss's tag with --loss-tag")
    c = Curve(path, "tensorboard")
    if repeats:
        c.skipped["repeated step (later value kept)"] = repeats
    for s in sorted(series["loss"]):
        if s < 1:   # step 0: logged before the first optimizer step
            c.skipped["step 0"] = c.skipped.get("step 0", 0) + 1
            continue
        c.add(s, f"{path}: step {s}", **{k: series[k].get(s) for k in TAGS})
    if loss_tag is not None:
        c.recovered["loss_tag"] = loss_tag
    return c


def _read_bytes(path: Path) -> bytes:
    # read_text's size and type checks, on bytes: the one bounded reader, then the raw bytes
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise IntakeError(f"{p}: cannot read the event file ({e.strerror}); check the path") from None
    if not p.is_file():
        raise IntakeError(f"{p}: expected a regular event file, found something else")
    if size > MAX_TB_BYTES:
        raise IntakeError(f"{p}: the event file is {size:,} bytes, more than the {MAX_TB_BYTES:,} allowed; export the "
                          "scalars (tensorboard's CSV download) and import the CSV")
    raw = files._read_at_most(p, MAX_TB_BYTES)
    if raw is None:
        raise IntakeError(f"{p}: the event file grew past {MAX_TB_BYTES:,} bytes while being read")
    return raw
