# param comms / compute image: the AWS param-benchmark recipe's base, param at the recipe's commit
# (so the original comms.py and driver.py run beside reproflow), and reproflow.
#   docker build -t reproflow-param:<tag> -f containers/param.Dockerfile .   (or: make containers)
#   enroot import -o /apps/reproflow-param.sqsh dockerd://reproflow-param:<tag>
ARG BASE_IMAGE=763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.0.1-gpu-py310-cu118-ubuntu20.04-ec2
FROM ${BASE_IMAGE}

# param has no releases; the recipe pins this commit.
ARG PARAM_COMMIT=6236487e8969838822b52298c2a2318f6ac47bbd
RUN git clone https://github.com/facebookresearch/param.git /param \
 && git -C /param checkout ${PARAM_COMMIT} \
 && rm -rf /param/.git

COPY containers/requirements.txt /tmp/reproflow-requirements.txt
RUN pip install --no-cache-dir -r /tmp/reproflow-requirements.txt
COPY . /opt/reproflow
RUN pip install --no-cache-dir --no-deps -e /opt/reproflow

ARG REPROFLOW_GIT_COMMIT=unknown
ENV REPROFLOW_GIT_COMMIT=${REPROFLOW_GIT_COMMIT} \
    REPROFLOW_ROOT=/opt/reproflow \
    PARAM_DIR=/param \
    PARAM_COMMIT=${PARAM_COMMIT}
WORKDIR /opt/reproflow
