"""Slurm's GPU numbers against NVML's GPUs (governor.backends.gpuid.find_slurm_gpu), on plain objects."""

from types import SimpleNamespace

import pytest

from governor.backends.gpuid import GpuNotFound, find_slurm_gpu


def _gpus(*minors):
    return [SimpleNamespace(id=str(i), uuid=f"GPU-{i}", device_minor=m) for i, m in enumerate(minors)]


@pytest.mark.parametrize("numbering", ["auto", "device_file"])
def test_a_node_where_one_gpu_reports_no_device_file_reads_no_number_by_device_file(numbering):
    """One GPU's nvmlDeviceGetMinorNumber failed (an NVMLError of any kind sets device_minor None) while the others
    report theirs: the device files' order is then unknown. Taken as NVML's index (the reading for a node where no
    GPU reports a file), "device_file" was silently not what the operator set, and "auto" took a number with no
    check that both orders agree: here Slurm's 0 is /dev/nvidia0, NVML's GPU 1, and NVML's GPU 0 was held."""
    gpus = _gpus(None, 0, 2)
    with pytest.raises(GpuNotFound, match="no device file"):
        find_slurm_gpu(gpus, 0, numbering)
    assert find_slurm_gpu(gpus, 0, "index") is gpus[0]


def test_where_no_gpu_reports_a_device_file_a_number_is_nvmls_index():
    gpus = _gpus(None, None)
    for numbering in ("auto", "device_file", "index"):
        assert find_slurm_gpu(gpus, 1, numbering) is gpus[1]
