# A stand-in for the gpu flavour's base (nvidia/cuda:<version>-cudnn-devel) where NVIDIA's registry cannot be
# reached: Debian 12, the cpu flavour's base, with the CUDA toolchain torch's CUDA build asks for, from
# PyPI's wheels, laid out the way NVIDIA's devel images lay it out. `make gpu-image-here` builds it and then
# the gpu flavour on it (containers/build.sh with CUDA_STANDIN=1).
#   /usr/local/cuda/{bin,include,lib64}: nvcc, headers (NVML's, the profiler API's and CUPTI's too), the
#       libraries with their lib*.so links for the linker (the wheels ship only lib*.so.N), in ld.so.conf
#       (cudnn comes with torch's own wheels)
#   /usr/local/cuda/lib64/stubs/libcuda.so: a libcuda to link against (Open MPI's CUDA support links it;
#       at run time the node's driver provides the real one). NVIDIA's images ship a stub there; here it is
#       the driver library of Debian's non-free libcuda1 package, pinned by its sha256.
ARG DEBIAN_BASE=localhost/reproflow-base:bookworm
# hadolint ignore=DL3006
FROM ${DEBIAN_BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# The version torch 2.13.0+cu130 requires (its cuda-toolkit[...] pin); the pin check compares them.
ARG CUDA_TOOLKIT_VERSION=13.0.3
ARG LIBCUDA_DEB=libcuda1_535.261.03-1_amd64.deb
ARG LIBCUDA_SHA256=de1e9ca34164a5983b3f752e6699cf1ad924790f1a843b7d582bab6f99206e1e
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
# The toolchain's wheels in their own folder, outside the image's Python environment.
ARG CUDA_PARTS=nvcc,cudart,crt,cccl,nvvm,nvrtc,nvml,profiler,cupti,cublas,cusparse,cusolver,curand,cufft,nvtx,nvjitlink,culibos
RUN python3 -m venv /tmp/pip \
 && /tmp/pip/bin/pip install --no-cache-dir --disable-pip-version-check --target /opt/cuda-wheels \
        "cuda-toolkit[${CUDA_PARTS}]==${CUDA_TOOLKIT_VERSION}" \
 && rm -rf /tmp/pip
# hadolint ignore=DL3003
RUN cuda="/opt/cuda-wheels/nvidia/cu${CUDA_TOOLKIT_VERSION%%.*}" \
 && ln -s lib "$cuda/lib64" && ln -s "$cuda" /usr/local/cuda \
 && mkdir -p "$cuda/lib/stubs" && cd /tmp \
 && curl -fsSLO "http://deb.debian.org/debian/pool/non-free/n/nvidia-graphics-drivers/${LIBCUDA_DEB}" \
 && echo "${LIBCUDA_SHA256}  ${LIBCUDA_DEB}" | sha256sum --check --quiet \
 && dpkg-deb -x "${LIBCUDA_DEB}" /tmp/libcuda \
 && cp "$(find /tmp/libcuda -name 'libcuda.so.*.*' | head -n 1)" "$cuda/lib/stubs/libcuda.so" \
 && rm -rf /tmp/libcuda "${LIBCUDA_DEB}" \
 && for lib in "$cuda"/lib/lib*.so.[0-9]*; do \
        dev="${lib%%.so.*}.so"; [ -e "$dev" ] || ln -s "${lib##*/}" "$dev"; done \
 && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/000_cuda.conf && ldconfig \
 && /usr/local/cuda/bin/nvcc --version | tail -n 2
# As NVIDIA's images: Enroot's and the NVIDIA container runtime's hooks give such a container the node's driver.
ENV CUDA_HOME=/usr/local/cuda CUDA_VERSION=${CUDA_TOOLKIT_VERSION} PATH=/usr/local/cuda/bin:${PATH} \
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
