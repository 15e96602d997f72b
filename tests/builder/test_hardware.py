import pytest

from trt_spec.builder.hardware import HardwareError, named_gpu, parse_nvidia_smi, resolve_gpu


def test_named_gpus_and_fp8():
    h100 = named_gpu("h100:2")
    assert h100.count == 2 and h100.has_fp8
    l40s = named_gpu("L40S")
    assert l40s.has_fp8  # Ada: FP8
    a100 = named_gpu("a100-80gb:1")
    assert not a100.has_fp8 and a100.memory_gib == 80.0


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(HardwareError, match="unknown GPU 'h300'.*h100.*h200"):
        named_gpu("h300")
    with pytest.raises(HardwareError, match="must be an integer"):
        named_gpu("h100:two")


def test_parse_nvidia_smi_csv():
    g = parse_nvidia_smi("NVIDIA H200, 9.0, 143771\nNVIDIA H200, 9.0, 143771\n")
    assert g.name == "h200" and g.count == 2 and g.compute_capability == (9, 0)
    assert abs(g.memory_gib - 140.4) < 0.1
    a = parse_nvidia_smi("NVIDIA A100-SXM4-80GB, 8.0, 81920\n")
    assert a.name == "a100" and not a.has_fp8


def test_override_beats_config():
    assert resolve_gpu("h100", "a100-40gb:2").name == "a100-40gb"
    assert resolve_gpu("h200:1").name == "h200"


def test_a_gpu_without_a_count_is_never_silently_eight():
    """--gpu NAME takes the count of the config's gpu: NAME:COUNT; another GPU (or none counted) needs :COUNT; a config
    that names no count says that 8 is an assumption."""
    g = resolve_gpu("h100:2", "h100")
    assert g.count == 2 and g.source == "--gpu h100, count from the config's gpu: h100:2"
    assert resolve_gpu("h100:2", "h100:4").count == 4 and resolve_gpu("h100:2", "h100:4").source == "--gpu"
    for config in ("h200:1", "h100", "auto"):
        with pytest.raises(HardwareError, match=r"--gpu h100 names no GPU count .*--gpu h100:COUNT"):
            resolve_gpu(config, "h100")
    assumed = resolve_gpu("h100")
    assert assumed.count == 8 and "names no count, an 8-GPU node assumed" in assumed.source
    with pytest.raises(HardwareError, match="unknown GPU 'h1000'"):
        resolve_gpu("h100:2", "h1000")
