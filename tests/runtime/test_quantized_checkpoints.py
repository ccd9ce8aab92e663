"""Quantized safetensors checkpoints (FP8, compressed-tensors, GPTQ, AWQ) load dequantized to the
float weights their codes stand for, and serve as those weights do."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import quantized_writers as qw
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.model.quant_config import quantization_from_dict
from radixflow.runtime.model.weights import build_model

_CT_PACK4 = dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=16)


class _Ct:
    """A compressed-tensors (writer, quantization_config) pair, built when first used: the library is
    imported by the tests that write such checkpoints only (the GPU image need not have it)."""

    def __init__(self, fmt: str, **weights) -> None:
        self.fmt, self.weights, self.built = fmt, weights, None

    def __iter__(self):
        if self.built is None:
            self.built = qw.compressed_tensors(self.fmt, self.weights)
        return iter(self.built)

    def __getitem__(self, i: int):
        return tuple(self)[i]


def _ct(fmt: str, **weights) -> _Ct:
    return _Ct(fmt, **weights)


# (writer, quantization_config) of each stored form; the tiny models' dims are 64, 112 (MLP), 128 (q), 32 (k, v)
FORMATS = {
    "fp8-block": (qw.fp8_block((16, 32)), {"quant_method": "fp8", "activation_scheme": "dynamic",
                                           "weight_block_size": [16, 32]}),
    "fp8-tensor": (qw.fp8_per_tensor, {"quant_method": "fp8", "activation_scheme": "static"}),
    "fbgemm-fp8-channel": (qw.fp8_block((1, 1 << 20), inverse_name=False), {"quant_method": "fbgemm_fp8"}),
    "modelopt-fp8": (qw.fp8_per_tensor, {"quant_method": "modelopt", "quant_algo": "FP8"}),
    "ct-pack4-group": _ct("pack-quantized", **_CT_PACK4),
    "ct-pack4-asym": _ct("pack-quantized", num_bits=4, type="int", symmetric=False, strategy="group", group_size=16),
    "ct-pack8-channel": _ct("pack-quantized", num_bits=8, type="int", symmetric=True, strategy="channel"),
    # compressed-tensors packs zero points of group and channel scales only; a tensor's is stored as is
    "ct-pack4-asym-tensor": _ct("pack-quantized", num_bits=4, type="int", symmetric=False, strategy="tensor"),
    "ct-pack4-asym-block": _ct("pack-quantized", num_bits=4, type="int", symmetric=False, strategy="block",
                               block_structure=[8, 16]),
    "ct-fp8-tensor": _ct("float-quantized", num_bits=8, type="float", strategy="tensor"),
    "ct-fp8-channel": _ct("float-quantized", num_bits=8, type="float", strategy="channel"),
    "ct-fp8-block": _ct("float-quantized", num_bits=8, type="float", strategy="block", block_structure=[8, 16]),
    "ct-int8-channel": _ct("int-quantized", num_bits=8, type="int", symmetric=True, strategy="channel"),
    "ct-int8-asym-group": _ct("int-quantized", num_bits=8, type="int", symmetric=False, strategy="group",
                              group_size=16),
    "gptq4": (qw.gptq(4, 16), {"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": False}),
    "gptq4-per-channel": (qw.gptq(4, -1), {"quant_method": "gptq", "bits": 4, "group_size": -1}),
    "gptq8-desc-act": (qw.gptq(8, 32, desc_act=True), {"quant_method": "gptq", "bits": 8, "group_size": 32,
                                                       "desc_act": True}),
    "gptq2-v2": (qw.gptq(2, 16, v1=False), {"quant_method": "gptq", "bits": 2, "group_size": 16,
                                            "checkpoint_format": "gptq_v2"}),
    "awq": (qw.awq(16), {"quant_method": "awq", "bits": 4, "group_size": 16, "version": "gemm", "zero_point": True}),
}


def _params(model_dir: str) -> dict[str, torch.Tensor]:
    model = build_model(load_model_args(model_dir), model_dir, torch.float32, torch.device("cpu"), 64)
    return dict(model.state_dict())


def _quantized_and_float(hf_checkpoint, tmp_path, family: str, fmt: str, **kw) -> tuple[str, str]:
    src, _ = hf_checkpoint(family)
    writer, config = FORMATS[fmt]
    meant = qw.quantized_copy(src, str(tmp_path / "q"), writer, config, **kw)
    assert meant, "the writer quantized no layer"
    return str(tmp_path / "q"), qw.float_copy(src, str(tmp_path / "f"), meant)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_quantized_weights_load_as_the_floats_they_mean(hf_checkpoint, tmp_path, fmt):
    quantized, floats = _quantized_and_float(hf_checkpoint, tmp_path, "llama3", fmt)
    got, want = _params(quantized), _params(floats)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-7, msg=name)
    original = _params(hf_checkpoint("llama3")[0])  # and the codes do change the weights (else this tests nothing)
    assert not torch.equal(got["layers.0.mlp.down_proj.weight"], original["layers.0.mlp.down_proj.weight"])


@pytest.mark.parametrize("family, fmt", [("phi3", "gptq4"), ("qwen3_moe", "awq"), ("qwen2", "ct-pack4-group"),
                                         ("mixtral", "fp8-block")])
def test_fused_and_expert_layers_dequantize_too(hf_checkpoint, tmp_path, family, fmt):
    """Phi-3's fused qkv / gate_up, Qwen3-MoE's and Mixtral's experts (w1/w2/w3), Qwen2's biases."""
    layers = (lambda n: n.startswith("model.layers.") and n.endswith(("proj.weight", ".w1.weight", ".w2.weight",
                                                                       ".w3.weight")))
    quantized, floats = _quantized_and_float(hf_checkpoint, tmp_path, family, fmt, layers=layers)
    got, want = _params(quantized), _params(floats)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-7, msg=name)


def test_fp8_block_checkpoint_matches_transformers(hf_checkpoint, tmp_path):
    """transformers dequantizes a block-FP8 checkpoint on CPU: its logits are ours."""
    import transformers as tf

    src, _ = hf_checkpoint("llama3")
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
    qw.quantized_copy(src, str(tmp_path), qw.fp8_block((16, 16)), config)
    hf = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf.model.layers[0].mlp.down_proj.weight.dtype == torch.float32  # dequantized, not run in fp8
    prompt = [5, 77, 300, 12, 901, 44]
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0]
    from test_model_parity import _our_logits

    torch.testing.assert_close(_our_logits(str(tmp_path), [prompt])[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["gptq4", "ct-pack4-group", "fp8-block", "awq"])
def test_engine_serves_a_quantized_checkpoint_as_its_floats(hf_checkpoint, tmp_path, fmt):
    from radixflow.runtime import Engine

    quantized, floats = _quantized_and_float(hf_checkpoint, tmp_path, "llama3", fmt)
    prompts = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9]]
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    outs = {}
    for name, model_dir in (("quantized", quantized), ("float", floats)):
        with Engine(model_dir, kv_cache_tokens=1024) as engine:
            outs[name] = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    assert outs["quantized"] == outs["float"]


def test_mixed_precision_groups_pick_each_layers_scheme(hf_checkpoint, tmp_path):
    """compressed-tensors groups: the MLPs 4-bit packed by a `re:` target, the rest int8 per channel."""
    src, _ = hf_checkpoint("llama3")
    mlp_writer, mlp_cfg = _ct("pack-quantized", **_CT_PACK4)
    attn_writer, attn_cfg = _ct("int-quantized", num_bits=8, type="int", symmetric=True, strategy="channel")
    config = {**attn_cfg, "format": "mixed-precision", "config_groups": {
        "mlp": {**mlp_cfg["config_groups"]["group_0"], "targets": ["re:.*mlp.*"], "format": "pack-quantized"},
        "rest": {**attn_cfg["config_groups"]["group_0"], "format": "int-quantized"}}}
    writer = lambda layer, w: (mlp_writer if ".mlp." in layer else attn_writer)(layer, w)  # noqa: E731
    meant = qw.quantized_copy(src, str(tmp_path / "q"), writer, config)
    got, want = _params(str(tmp_path / "q")), _params(qw.float_copy(src, str(tmp_path / "f"), meant))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-7, msg=name)
    q = quantization_from_dict(config)
    assert q.scheme_for("model.layers.0.mlp.up_proj").kind == "packed"
    assert q.scheme_for("model.layers.0.self_attn.q_proj").kind == "scaled"


@pytest.mark.parametrize("config_file, writer, config", [
    ("quantize_config.json", qw.gptq(4, 16), {"bits": 4, "group_size": 16, "desc_act": False, "sym": True}),
    ("quant_config.json", qw.awq(16), {"zero_point": True, "q_group_size": 16, "w_bit": 4, "version": "GEMM"}),
    ("hf_quant_config.json", qw.fp8_per_tensor, {"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "FP8", "kv_cache_quant_algo": None}}),
])
def test_a_quantization_config_file_of_its_own_is_read(hf_checkpoint, tmp_path, config_file, writer, config):
    """AutoGPTQ, AutoAWQ and ModelOpt exports keep their settings in a file of their own, without quant_method."""
    src, _ = hf_checkpoint("llama3")
    meant = qw.quantized_copy(src, str(tmp_path / "q"), writer, config, config_file=config_file)
    got, want = _params(str(tmp_path / "q")), _params(qw.float_copy(src, str(tmp_path / "f"), meant))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-7, msg=name)


@pytest.mark.parametrize("config, match", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, r"quant_method 'bitsandbytes' is not supported"),
    ({"quant_method": "gptq", "bits": 3}, r"GPTQ bits 3 is not supported"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, r"checkpoint_format 'marlin'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, r"group_size must be"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, r"AWQ version 'gemv' is not supported"),
    ({"quant_method": "awq", "bits": 4, "zero_point": False}, r"zero_point false"),
    ({"quant_method": "awq", "bits": 8}, r"AWQ bits 8"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, r"weight_block_size must be two positive integers"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, r"quant_algo 'NVFP4' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
                                                                  "strategy": "tensor_group", "group_size": 16}}}},
     r"strategy 'tensor_group' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
                                                                  "strategy": "group", "group_size": 16}}}},
     r"format 'nvfp4-pack-quantized' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
                                                                  "strategy": "group", "group_size": 16}}}},
     r"pack-quantized float weights are not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "transform_config": {"x": {}},
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}},
     r"transform_config"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "sparsity_config": {"format": "sparse-24-bitmask"},
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}},
     r"sparsity format 'sparse-24-bitmask'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"W4A16": ["Linear"]}},
     r"config_groups\.W4A16 must be an object"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": ["Linear"]},
     r"config_groups must be an object"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": "W4"}}},
     r"config_groups\.g\.weights must be an object"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"targets": 5, "weights": {"num_bits": 4, "type": "int"}}}},
     r"config_groups\.g\.targets must be a list of names"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "sparsity_config": "dense",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}},
     r"sparsity_config must be an object"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}},
     r"config_groups\.g: strategy group needs a positive group_size"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block"}}}},
     r"config_groups\.g: strategy block needs a block_structure"),
    ({"quant_method": "modelopt", "quantization": "FP8"}, r"quantization must be an object"),
    ({"quant_method": "awq", "bits": 4, "zero_point": "false"}, r"AWQ zero_point must be true or false"),
    ({"quant_method": "gptq", "bits": "4"}, r"GPTQ bits '4' is not supported"),
])
def test_unsupported_quantizations_are_refused_naming_the_setting(hf_checkpoint, tmp_path, config, match):
    src, _ = hf_checkpoint("llama3")
    qw.quantized_copy(src, str(tmp_path), qw.gptq(4, 16), config)
    with pytest.raises(ValueError, match=r"config\.json: .*" + match):
        build_model(load_model_args(str(tmp_path)), str(tmp_path), torch.float32, torch.device("cpu"), 64)


def _rewrite(model_dir: str, edit) -> None:
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _regroup(name: str, size: int):
    """An edit storing layer `name`'s GPTQ / AWQ scales and zeros as if in groups of `size` rows."""
    def edit(t):
        for part in ("scales", "qzeros"):
            stored = t[f"{name}.{part}"]
            t[f"{name}.{part}"] = stored[:1].repeat(-(-64 // size), 1)
        t.pop(f"{name}.g_idx", None)
    return edit


@pytest.mark.parametrize("fmt, edit, match", [
    ("gptq4", lambda t: t.pop("model.layers.1.mlp.up_proj.qzeros"), r"'model\.layers\.1\.mlp\.up_proj' \(gptq\) "
                                                                     r"lacks model\.layers\.1\.mlp\.up_proj\.qzeros"),
    ("gptq4", lambda t: t.__setitem__("model.layers.0.mlp.up_proj.g_idx", torch.full((64,), 9, dtype=torch.int32)),
     r"group index beside model\.layers\.0\.mlp\.up_proj\.scales"),
    ("gptq4", lambda t: t.__setitem__("model.layers.0.mlp.up_proj.scales", torch.ones(4, 100, dtype=torch.float16)),
     r"model\.layers\.0\.mlp\.up_proj: qweight .* do not fit together"),
    ("fp8-block", lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.weight_scale_inv", torch.ones(3, 3)),
     r"o_proj\.weight_scale has shape \(3, 3\); a \[64, 128\] weight in 16x32 blocks needs \(4, 4\)"),
    ("fp8-tensor", lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.weight",
                                           torch.zeros(64, 128, dtype=torch.bfloat16)),
     r"o_proj\.weight is bfloat16 beside a weight scale; a quantized checkpoint stores fp8 or int8"),
    ("ct-pack4-group", lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight_shape", torch.tensor([64, 999])),
     r"down_proj\.weight_packed \(64, 14\) does not hold a \[64, 999\] weight"),
    # scales in groups other than the config's group_size (16 here): refused, never spread over the columns
    ("awq", _regroup("model.layers.0.self_attn.q_proj", 32), r"q_proj\.scales has 2 groups; 64 input columns "
                                                            r"in groups of 16 need 4"),
    ("gptq4", _regroup("model.layers.0.self_attn.q_proj", 8), r"q_proj\.scales has 8 groups; 64 input columns "
                                                             r"in groups of 16 need 4"),
    ("ct-pack4-group", lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight_scale", torch.ones(128, 8)),
     r"q_proj\.weight_scale has 8 groups; 64 input columns in groups of 16 need 4"),
    ("ct-fp8-channel", lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight_scale", torch.ones(128, 4)),
     r"q_proj\.weight_scale has shape \(128, 4\), which fits no scaling"),
    # codes of another width than the config's bits
    ("ct-pack4-group", lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight_packed",
                                               torch.zeros(64, 28, dtype=torch.int32)),
     r"down_proj\.weight_packed \(64, 28\) does not hold a \[64, 112\] weight of 4-bit codes"),
    ("ct-pack4-group", lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight_packed",
                                               torch.zeros(64, 14, dtype=torch.float32)),
     r"down_proj\.weight_packed is float32; packed codes are int32"),
    ("gptq4", lambda t: t.__setitem__("model.layers.0.mlp.up_proj.qweight", torch.zeros(16, 112, dtype=torch.int32)),
     r"up_proj: qweight \(128 x 112 codes\), g_idx \(64 columns\)"),
    ("gptq4", lambda t: t.__setitem__("model.layers.0.mlp.up_proj.scales", torch.ones(112, dtype=torch.float16)),
     r"up_proj\.scales has shape \(112,\); GPTQ and AWQ scales are \[groups, out\]"),
    ("ct-pack4-group", lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight_shape", torch.tensor([64.0, 112.0])),
     r"down_proj\.weight_shape is float32; a shape is integers"),
    # an fp8 weight without its scale: its codes are not its values
    ("fp8-block", lambda t: t.pop("model.layers.0.mlp.down_proj.weight_scale_inv"),
     r"'model\.layers\.0\.mlp\.down_proj\.weight' .* is float8_e4m3fn with no scale beside it"),
    ("fp8-tensor", lambda t: [t.pop("model.layers.1.mlp.up_proj.weight_scale"), t.pop("model.layers.1.mlp.up_proj.input_scale")],
     r"'model\.layers\.1\.mlp\.up_proj\.weight' .* is float8_e4m3fn with no scale beside it"),
])
def test_quantized_tensors_that_disagree_with_the_config_are_refused(hf_checkpoint, tmp_path, fmt, edit, match):
    quantized, _ = _quantized_and_float(hf_checkpoint, tmp_path, "llama3", fmt)
    _rewrite(quantized, edit)
    with pytest.raises(ValueError, match=match):
        _params(quantized)


def test_targets_name_layers_as_the_checkpoint_stores_them(hf_checkpoint, tmp_path):
    """A bare checkpoint (`layers.0...`, no `model.` prefix): a group's anchored `re:` target and
    exact names match the stored names, not radixflow's."""
    src, _ = hf_checkpoint("qwen2")  # tied: a bare checkpoint loads
    mlp_writer, mlp_cfg = _ct("pack-quantized", **_CT_PACK4)
    attn_writer, attn_cfg = _ct("pack-quantized", num_bits=8, type="int", symmetric=True, strategy="channel")
    config = {**mlp_cfg, "config_groups": {
        "attn": {**attn_cfg["config_groups"]["group_0"], "targets": [r"re:^layers\.\d+\.self_attn\.[qk]_proj$",
                                                                      "layers.0.self_attn.v_proj",
                                                                      "layers.1.self_attn.v_proj"]},
        "rest": {**mlp_cfg["config_groups"]["group_0"], "targets": ["Linear"]}}}
    writer = lambda layer, w: (attn_writer if ".self_attn." in layer and "o_proj" not in layer  # noqa: E731
                               else mlp_writer)(layer, w)
    meant = qw.quantized_copy(src, str(tmp_path / "q"), writer, config)
    floats = qw.float_copy(src, str(tmp_path / "f"), meant)
    for d in (str(tmp_path / "q"), floats):
        _rewrite(d, lambda t: [t.__setitem__(n.removeprefix("model."), t.pop(n)) for n in list(t)])
    got, want = _params(str(tmp_path / "q")), _params(floats)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-7, msg=name)


def test_quantized_tensors_without_a_quantization_config_are_refused(hf_checkpoint, tmp_path):
    src, _ = hf_checkpoint("llama3")
    qw.quantized_copy(src, str(tmp_path), qw.gptq(4, 16), None)
    with pytest.raises(ValueError, match=r"int32; .*needs its quantization_config|not used by the model"):
        _params(str(tmp_path))


def test_a_quantized_layer_no_group_targets_is_refused(hf_checkpoint, tmp_path):
    src, _ = hf_checkpoint("llama3")
    writer, config = _ct("pack-quantized", **_CT_PACK4)
    config["config_groups"]["group_0"]["targets"] = ["re:.*self_attn.*"]
    qw.quantized_copy(src, str(tmp_path), writer, config)
    with pytest.raises(ValueError, match=r"quantized tensors of 'model\.layers\.0\.mlp\.\w+' match none"):
        _params(str(tmp_path))


def test_quantization_config_of_a_plain_checkpoint_with_no_quantized_layer_loads_it(hf_checkpoint, tmp_path):
    """A config that declares a quantization but whose tensors are all float (every layer ignored)
    loads those floats as they are."""
    src, _ = hf_checkpoint("llama3")
    qw.quantized_copy(src, str(tmp_path), qw.gptq(4, 16), FORMATS["gptq4"][1], layers=lambda n: False)
    with open(os.path.join(str(tmp_path), "config.json")) as f:
        assert json.load(f)["quantization_config"]["quant_method"] == "gptq"
    got, want = _params(str(tmp_path)), _params(src)
    assert all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("fmt", ["gptq4", "fp8-block", "awq"])  # not compressed-tensors': not in the GPU image
@pytest.mark.gpu
def test_gpu_serves_a_quantized_checkpoint_as_its_floats(hf_checkpoint, tmp_path, fmt):
    """On CUDA the dequantized weights load onto the device: greedy output as the float copy's."""
    from radixflow.runtime import Engine

    quantized, floats = _quantized_and_float(hf_checkpoint, tmp_path, "llama3", fmt)
    prompts = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9]]
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    outs = []
    for model_dir in (quantized, floats):
        with Engine(model_dir, device="cuda", dtype="float32", kv_cache_tokens=1024) as engine:
            outs.append([o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)])
    assert outs[0] == outs[1]


def test_the_quantization_flag_names_the_checkpoints_method(hf_checkpoint, tmp_path):
    """`--quantization` (vLLM's and SGLang's flag) only checks the method the config declares: the
    same method (or its _marlin name) loads, another one, a float checkpoint or an unknown name is
    refused saying why."""
    from radixflow.runtime import Engine
    from radixflow.runtime.config import EngineConfig

    quantized, _ = _quantized_and_float(hf_checkpoint, tmp_path, "llama3", "gptq4")
    for flag in ("gptq", "gptq_marlin"):
        with Engine(quantized, dtype="float32", kv_cache_tokens=256, quantization=flag) as engine:
            assert len(engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 2})["output_ids"]) == 2
    with pytest.raises(ValueError, match=r"--quantization awq: the checkpoint in .* is quantized with gptq"):
        Engine(quantized, dtype="float32", kv_cache_tokens=256, quantization="awq")
    src, _ = hf_checkpoint("llama3")
    with pytest.raises(ValueError, match=r"--quantization fp8: .* holds no quantized checkpoint .*quantizing float "
                                         r"weights at load is not supported"):
        Engine(src, dtype="float32", kv_cache_tokens=256, quantization="fp8")
    with pytest.raises(ValueError, match=r"quantization='bitsandbytes' is not one of fp8, "):
        EngineConfig(quantization="bitsandbytes")
