KERNELS: list[dict] = []
