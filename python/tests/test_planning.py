"""The plan learned from the loop through the C ABI: gpumem_runtime.step() after each iteration,
the plan in force after two that repeat, then no raw call; reset_planning() drops it."""
import gpumem_runtime


def iteration(chunks):
    """One iteration of a small training-like loop: activations kept, a temporary, freed in
    reverse."""
    a = chunks.malloc(3 << 20)
    b = chunks.malloc(1 << 20)
    tmp = chunks.malloc(5000)
    chunks.free(tmp)
    c = chunks.malloc(2 << 20)
    for ptr in (c, b, a):
        chunks.free(ptr)


def test_step_plans_a_repeated_loop_and_serves_it_with_no_raw_call(chunks):
    assert gpumem_runtime.plan_state(0) == "off"
    gpumem_runtime.free_all_blocks(0)
    gpumem_runtime.step(0)
    assert gpumem_runtime.plan_state(0) == "recording"
    for _ in range(4):
        iteration(chunks)
        gpumem_runtime.step(0)
    assert gpumem_runtime.plan_state(0) == "planned"
    gpumem_runtime.reset_peak_memory_stats(0)
    before = gpumem_runtime.memory_stats(0)
    for _ in range(10):
        iteration(chunks)
        gpumem_runtime.step(0)
    after = gpumem_runtime.memory_stats(0)
    assert after["num_device_alloc"] == before["num_device_alloc"]
    assert after["num_device_free"] == before["num_device_free"]
    # Held: the plan's block, as large as the iteration's peak in use (6 MiB).
    assert after["allocated_bytes.all.peak"] == 6 << 20
    assert after["reserved_bytes.all.peak"] == 6 << 20
    gpumem_runtime.reset_planning(0)
    assert gpumem_runtime.plan_state(0) == "off"
    gpumem_runtime.free_all_blocks(0)
    assert gpumem_runtime.memory_stats(0)["reserved_bytes.all.current"] == 0


def test_plan_automatically_finds_the_loop_with_no_step_calls(chunks):
    gpumem_runtime.reset_planning(0)
    gpumem_runtime.free_all_blocks(0)
    gpumem_runtime.plan_automatically(0)
    assert gpumem_runtime.plan_state(0) == "detecting"
    for _ in range(8):
        iteration(chunks)
        if gpumem_runtime.plan_state(0) == "planned":
            break
    assert gpumem_runtime.plan_state(0) == "planned"
    iteration(chunks)
    before = gpumem_runtime.memory_stats(0)
    for _ in range(10):
        iteration(chunks)
    after = gpumem_runtime.memory_stats(0)
    assert after["num_device_alloc"] == before["num_device_alloc"]
    assert after["num_device_free"] == before["num_device_free"]
    gpumem_runtime.reset_planning(0)
    assert gpumem_runtime.plan_state(0) == "off"
    gpumem_runtime.free_all_blocks(0)


def test_step_on_an_unknown_device_is_an_error():
    try:
        gpumem_runtime.step(42)
    except gpumem_runtime.GpumemError as e:
        assert "42" in str(e) or "device" in str(e).lower()
    else:
        raise AssertionError("step(42) did not fail")
