# Megatron-LM / Aceso / DeepSpeed image: NGC PyTorch (CUDA, NCCL, apex built in), megatron-core
# and DeepSpeed with its fused Adam op compiled at build time, and reproflow.
#   docker build -t reproflow-megatron:<tag> -f containers/megatron.Dockerfile .   (or: make containers)
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:24.05-py3
FROM ${BASE_IMAGE}

# NGC images ship NVIDIA apex compiled with --cpp_ext --cuda_ext; fail the build if it is not there.
RUN python -c "import apex, fused_layer_norm_cuda; print('apex', apex.__file__)"
ARG DEEPSPEED_VERSION=0.14.4
ARG MEGATRON_CORE_VERSION=0.7.0
RUN DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1 pip install --no-cache-dir --no-build-isolation \
        deepspeed==${DEEPSPEED_VERSION} \
 && pip install --no-cache-dir --no-deps megatron-core==${MEGATRON_CORE_VERSION}

# Megatron-LM itself, for `reproflow aceso megatron-lm --run` (the Megatron-LM baseline on a plan).
ARG MEGATRON_LM_REF=core_r0.7.0
RUN git clone --depth 1 --branch ${MEGATRON_LM_REF} https://github.com/NVIDIA/Megatron-LM.git /opt/Megatron-LM

COPY containers/requirements.txt /tmp/reproflow-requirements.txt
RUN pip install --no-cache-dir -r /tmp/reproflow-requirements.txt
COPY . /opt/reproflow
RUN pip install --no-cache-dir --no-deps -e /opt/reproflow

ARG REPROFLOW_GIT_COMMIT=unknown
ENV REPROFLOW_GIT_COMMIT=${REPROFLOW_GIT_COMMIT} \
    REPROFLOW_ROOT=/opt/reproflow
WORKDIR /opt/reproflow
