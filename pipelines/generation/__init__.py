"""Kernel generation: the space of Triton kernels per task, sampled, mutated and compiled.

    space.py        Family and Knob: one algorithm variant and its knob domains
    families/       one module per task: FAMILIES and SEED
    registry.py     finds a task's families; KernelPoint, render_point, make_record
    mutations.py    one-choice mutations (knob step, algorithm switch); SpaceMutator
    sampler.py      generate_lineage (mutation tree from the seed), sample_uniform, reachable_count
    reference.py    the task's PyTorch reference as a kernel record
    aot.py          compile features for sm_90 without a GPU (registers, spills, shared memory)
    candidates.py   build_candidates (the kernel_candidates asset / `kernelcast generate`), write_batch
    stored.py       generate_and_store: the kernel_candidates asset's build and write, in one call
    llm_mutator.py  an LLM behind the mutation interface (OpenAI-compatible endpoint)

No Dagster here; submodules are imported explicitly (nothing heavy at package import).
"""
