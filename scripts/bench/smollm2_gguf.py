"""Write an F32, F16 or BF16 copy of a quantised GGUF, for llama.cpp's side of the SmolLM2 benchmark
(scripts/bench/smollm2.sh): the same weights that `cairn import gguf` dequantises, in a type
llama.cpp computes with in floating point, so both engines run the same arithmetic on the same
numbers.

    python scripts/bench/smollm2_gguf.py IN.gguf OUT.gguf [--dtype f32|f16|bf16]

Every tensor is dequantised with `gguf.quants.dequantize` (Q4_1, Q8_0 and the F32 norms here)
and written as F32 (or F16 or BF16, rounded to nearest even as `cairn import gguf --dtype bf16`
and Cairn's load in bf16 round; the 1-D norm vectors stay F32, as llama.cpp's own converter
keeps them) under its GGUF name and shape, in llama.cpp's layout: the q/k rows stay permuted per
head, as llama.cpp expects them (the importer undoes the permutation only for the Hugging Face
directory). Every metadata key is copied as is, except `general.file_type`, which is set to
the new type (0 = ALL_F32, 1 = MOSTLY_F16, 32 = MOSTLY_BF16). Requires the `gguf` package (gguf==0.19.0, in
scripts/bench/requirements.txt).
"""

import argparse
import os
import sys

import numpy as np


def copy_field(writer, field, gguf):
    """Copies one metadata key (scalar, string or array) into `writer`."""
    vtype = field.types[0]
    value = field.contents()
    sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, value, vtype, sub_type=sub_type)


def convert(src, dst, dtype):
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tmp = dst + ".part"
    writer = gguf.GGUFWriter(tmp, arch)
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    }[dtype]
    for name, field in reader.fields.items():
        # GGUF.* are the header's own counts; the writer sets the architecture and alignment.
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        if name == "general.file_type":
            writer.add_file_type(int(file_type))
            continue
        copy_field(writer, field, gguf)
    if "general.file_type" not in reader.fields:
        writer.add_file_type(int(file_type))
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        # numpy order is ggml's `ne` reversed: [rows, cols] for a 2-D weight.
        shape = [int(x) for x in reversed(t.shape.tolist())]
        values = values.reshape(shape)
        if dtype == "f16" and values.ndim > 1:
            values = values.astype(np.float16)
        if dtype == "bf16" and values.ndim > 1:
            bf16 = gguf.GGMLQuantizationType.BF16
            writer.add_tensor(t.name, gguf.quants.quantize(values, bf16), raw_dtype=bf16)
            continue
        writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)
    return len(reader.tensors)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="the quantised GGUF (e.g. .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf)")
    p.add_argument("dst", help="the F32/F16/BF16 GGUF to write")
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    args = p.parse_args()
    if not os.path.isfile(args.src):
        sys.exit(f"smollm2_gguf: {args.src} does not exist (run scripts/setup.sh to fetch the model)")
    n = convert(args.src, args.dst, args.dtype)
    print(f"smollm2_gguf: wrote {args.dst} ({n} tensors, {args.dtype}, {os.path.getsize(args.dst) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
