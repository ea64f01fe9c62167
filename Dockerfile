# syntax=docker/dockerfile:1
# One image for the six services; the service is chosen by the command (Kubernetes `args`):
#   docker run IMAGE services/router/src/main.js      (registry, router, cache, batcher, worker, gateway)
# Targets: `runtime` (default, CPU; distroless, no shell) and `worker-gpu` (the worker with onnxruntime's
# CUDA execution provider, on NVIDIA's CUDA runtime image).
#   docker build -t REGISTRY/infermesh:TAG .
#   docker build --target worker-gpu -t REGISTRY/infermesh:TAG-gpu .

ARG NODE_IMAGE=node:24-bookworm-slim

# ---- build: compile TypeScript (buf generate + tsc) with every dependency ---------------------------
FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json .npmrc ./
RUN npm ci --no-audit --no-fund
COPY . .
RUN npm run build \
 # Only what the services run. dist/ holds no tests or test support (tsconfig.build.json); the CLI and
 # the demo models' builder are not needed in the image either.
 && rm -rf dist/tools dist/libs/model-builder dist/.tsbuildinfo \
 && find dist -name '*.map' -delete \
 && rm -f dist/node_modules/@infermesh/model-builder

# ---- production dependencies only; no install script runs (none is needed: onnxruntime-node's only ----
# fetches its CUDA binaries, which worker-gpu asks for below)
FROM ${NODE_IMAGE} AS deps
WORKDIR /src
COPY package.json package-lock.json .npmrc ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund

# ---- worker-gpu's extra: onnxruntime-node's CUDA 12 binaries (its install step fetches them) --------
FROM deps AS deps-cuda
RUN node node_modules/onnxruntime-node/script/install.js --onnxruntime-node-install=cuda12 \
 && test -f node_modules/onnxruntime-node/bin/napi-v6/linux/x64/libonnxruntime_providers_cuda.so

# ---- runtime (default): Node 24 on distroless, non-root, read-only friendly --------------------------
FROM gcr.io/distroless/nodejs24-debian12:nonroot AS runtime
WORKDIR /app
ENV NODE_ENV=production
COPY --from=deps /src/package.json ./package.json
COPY --from=deps /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
# The worker's execution threads run this plain CommonJS file from the source tree (tsc does not copy it).
COPY --from=build /src/services/worker/src/execution-thread.js ./services/worker/src/execution-thread.js
USER 65532:65532
WORKDIR /app/dist
# distroless's entrypoint is node itself: the command names the service.
CMD ["services/gateway/src/main.js"]

# ---- worker-gpu: the worker on CUDA 12 + cuDNN 9 ------------------------------------------------------
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS worker-gpu
COPY --from=build /usr/local/bin/node /usr/local/bin/node
WORKDIR /app
# MALLOC_*: what `infermesh up` gives a worker (WORKER_MALLOC_ENV, libs/system/src/system.ts; the CPU
# image's workers get them from their Deployment): the memory a model held goes back when it is unloaded.
ENV NODE_ENV=production \
    MALLOC_MMAP_THRESHOLD_=4194304 \
    MALLOC_TRIM_THRESHOLD_=33554432
COPY --from=deps-cuda /src/package.json ./package.json
COPY --from=deps-cuda /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY --from=build /src/services/worker/src/execution-thread.js ./services/worker/src/execution-thread.js
USER 65532:65532
WORKDIR /app/dist
ENTRYPOINT ["/usr/local/bin/node"]
CMD ["services/worker/src/main.js"]
