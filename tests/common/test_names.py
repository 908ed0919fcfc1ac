from edgedistill.common.names import did_you_mean


def test_a_name_near_a_known_one_is_suggested():
    assert did_you_mean("CPUExecutionProvder", ["CPUExecutionProvider", "CUDAExecutionProvider"]) == (
        "did you mean CPUExecutionProvider? "
    )


def test_a_name_near_none_suggests_nothing():
    assert did_you_mean("zzz", ["MatMul", "Conv"]) == ""
