-- kernelcast warehouse, version 3: compile features also count what a kernel module launches.
-- n_kernels: distinct Triton kernels the module compiles for its input; n_launches: kernel
-- launches one call of custom_kernel makes. Both feed the classical cost model and the
-- "+features" prompt style.
ALTER TABLE kernel_features ADD COLUMN n_kernels INTEGER;
ALTER TABLE kernel_features ADD COLUMN n_launches INTEGER;
