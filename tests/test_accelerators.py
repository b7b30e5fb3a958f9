"""The accelerator catalog: datasheet peaks for GPUs, a measured peak for this CPU."""

from __future__ import annotations

import pytest

from fm_pipeline.accelerators import cuda_accelerator_name, get_accelerator


def test_h100_bf16_peak_is_the_dense_datasheet_figure():
    assert get_accelerator("H100").peak_flops("bf16") == pytest.approx(989e12)


def test_cpu_peak_is_measured_and_plausible():
    cpu = get_accelerator("cpu")
    assert 1e9 < cpu.peak_flops("fp32") < 1e13


def test_unknown_accelerator_is_named():
    with pytest.raises(ValueError, match="unknown accelerator 'tpu-v9'"):
        get_accelerator("tpu-v9")


def test_cuda_device_names_map_to_catalog_keys():
    assert cuda_accelerator_name("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert cuda_accelerator_name("NVIDIA A100-SXM4-40GB") == "a100-40gb"
