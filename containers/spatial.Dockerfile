# Spatial-parallelism image: NGC PyTorch with its CUDA-aware Open MPI (HPC-X, UCX), mpi4py built
# from source against that MPI, and reproflow.
#   docker build -t reproflow-spatial:<tag> -f containers/spatial.Dockerfile .   (or: make containers)
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:24.05-py3
FROM ${BASE_IMAGE}

ARG MPI4PY_VERSION=3.1.6
# Build against the image's MPI, never a wheel that bundles its own.
RUN MPICC="$(command -v mpicc)" pip install --no-cache-dir --no-binary mpi4py mpi4py==${MPI4PY_VERSION} \
 && ompi_info --parsable --all | grep -q "mpi_built_with_cuda_support:value:true"

COPY containers/requirements.txt /tmp/reproflow-requirements.txt
RUN pip install --no-cache-dir -r /tmp/reproflow-requirements.txt
COPY . /opt/reproflow
RUN pip install --no-cache-dir --no-deps -e /opt/reproflow

ARG REPROFLOW_GIT_COMMIT=unknown
ENV REPROFLOW_GIT_COMMIT=${REPROFLOW_GIT_COMMIT} \
    REPROFLOW_ROOT=/opt/reproflow
WORKDIR /opt/reproflow
