import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { buildMlpModel } from '@infermesh/model-builder';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import * as ort from 'onnxruntime-node';
import { SERVICE_NAMES } from '@infermesh/system';
import { API_KEY, metricValue, startFixture } from '../../e2e/support/system-fixture';
import { quantile, round, table } from './stats';

const REQUESTS = 300;
const WARMUP = 30;
const IDLE_WINDOW_MS = 5_000;

/**
 * p50/p99 of the demo MLP at concurrency 1, batch 1: in-process onnxruntime-node, REST through the
 * gateway, and gRPC through the gateway, measured interleaved in one run so that the machine's
 * noise hits all three alike. Every request carries different inputs, so the result cache misses.
 */
export async function latency(): Promise<Record<string, unknown>> {
  const model = buildMlpModel();
  const session = await ort.InferenceSession.create(model.bytes, { intraOpNumThreads: 1, interOpNumThreads: 1 });
  // The worker runs the model with the same ONNX Runtime threads as the in-process reference.
  const fixture = await startFixture({ models: ['mlp'], env: { WORKER_INTRA_OP_THREADS: '1' } });
  const grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
  const url = `${fixture.system.gatewayUrl}/v2/models/mlp/infer`;
  const headers = { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' };
  const metadata = { authorization: `Bearer ${API_KEY}` };

  const inputFor = (i: number) => {
    const data = new Float32Array(512);
    for (let j = 0; j < 512; j++) data[j] = Math.sin(i * 512 + j);
    return data;
  };
  const paths = {
    inprocess: async (data: Float32Array) => {
      await session.run({ input: new ort.Tensor('float32', data, [1, 512]) });
    },
    rest: async (data: Float32Array) => {
      const res = await fetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify({
          inputs: [{ name: 'input', shape: [1, 512], datatype: 'FP32', data: Array.from(data) }],
        }),
      });
      if (res.status !== 200) throw new Error(`REST answered ${res.status}: ${await res.text()}`);
      await res.arrayBuffer();
    },
    grpc: async (data: Float32Array) => {
      await grpc.modelInfer(
        create(ModelInferRequestSchema, {
          modelName: 'mlp',
          inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 512n] }],
          rawInputContents: [new Uint8Array(data.buffer)],
        }),
        { metadata, timeoutMs: 30_000 },
      );
    },
  };
  const samples: Record<keyof typeof paths, number[]> = { inprocess: [], rest: [], grpc: [] };
  let cpuPerRequestUs: Record<string, number> = {};
  const cpuSeconds = async () =>
    Object.fromEntries(
      await Promise.all(
        SERVICE_NAMES.map(
          async (name) =>
            [
              name,
              await metricValue(fixture.system.metricsUrl(name), 'process_cpu_seconds_total', { service: name }),
            ] as const,
        ),
      ),
    );
  let cpuBefore: Record<string, number> = {};
  let idlePerMs: Record<string, number> = {};
  let idleCpuPercent: Record<string, number> = {};
  let loopStart = 0;
  try {
    for (let i = 0; i < WARMUP + REQUESTS; i++) {
      for (const name of Object.keys(paths) as (keyof typeof paths)[]) {
        const data = inputFor(i * 3 + Object.keys(paths).indexOf(name));
        const start = process.hrtime.bigint();
        await paths[name](data);
        const ms = Number(process.hrtime.bigint() - start) / 1e6;
        if (i >= WARMUP) samples[name].push(ms);
      }
      if (i === WARMUP - 1) {
        // What the services burn with no traffic (timers, polls) is measured first and subtracted.
        const idleStart = await cpuSeconds();
        await new Promise((r) => setTimeout(r, IDLE_WINDOW_MS));
        const idleEnd = await cpuSeconds();
        idlePerMs = Object.fromEntries(
          SERVICE_NAMES.map((name) => [name, (idleEnd[name]! - idleStart[name]!) / IDLE_WINDOW_MS]),
        );
        cpuBefore = await cpuSeconds();
        loopStart = Date.now();
      }
    }
    const cpuAfter = await cpuSeconds();
    const loopMs = Date.now() - loopStart;
    // Each measured round sends one REST and one gRPC request through the system.
    cpuPerRequestUs = Object.fromEntries(
      SERVICE_NAMES.map((name) => {
        const busy = cpuAfter[name]! - cpuBefore[name]! - idlePerMs[name]! * loopMs;
        return [name, round((Math.max(0, busy) * 1e6) / (2 * REQUESTS), 0)];
      }),
    );
    idleCpuPercent = Object.fromEntries(SERVICE_NAMES.map((name) => [name, round(idlePerMs[name]! * 1000 * 100, 2)]));
  } finally {
    grpc.close();
    await session.release();
    await fixture.stop();
  }

  const p = (name: keyof typeof paths, q: number) => round(quantile(samples[name], q));
  const result = {
    scenario: 'latency',
    model: 'mlp (FP32 512-2048-2048-512, batch 1)',
    requests_per_path: REQUESTS,
    concurrency: 1,
    inprocess_p50_ms: p('inprocess', 0.5),
    inprocess_p99_ms: p('inprocess', 0.99),
    rest_p50_ms: p('rest', 0.5),
    rest_p99_ms: p('rest', 0.99),
    grpc_p50_ms: p('grpc', 0.5),
    grpc_p99_ms: p('grpc', 0.99),
    rest_over_inprocess_p50: round(quantile(samples.rest, 0.5) / quantile(samples.inprocess, 0.5)),
    grpc_over_inprocess_p50: round(quantile(samples.grpc, 0.5) / quantile(samples.inprocess, 0.5)),
    rest_added_p50_ms: round(quantile(samples.rest, 0.5) - quantile(samples.inprocess, 0.5)),
    grpc_added_p50_ms: round(quantile(samples.grpc, 0.5) - quantile(samples.inprocess, 0.5)),
    /** Process CPU time of each service per request through the system (REST and gRPC averaged), idle burn subtracted. */
    cpu_us_per_req: cpuPerRequestUs,
    /** CPU each service uses with no traffic, in percent of one core. */
    idle_cpu_percent: idleCpuPercent,
  };
  process.stdout.write(
    `${table(
      ['path', 'p50 ms', 'p99 ms', 'p50 / in-process'],
      [
        ['in-process onnxruntime-node', result.inprocess_p50_ms, result.inprocess_p99_ms, 1],
        ['REST via gateway (6 services)', result.rest_p50_ms, result.rest_p99_ms, result.rest_over_inprocess_p50],
        ['gRPC via gateway (6 services)', result.grpc_p50_ms, result.grpc_p99_ms, result.grpc_over_inprocess_p50],
      ],
    )}\n`,
  );
  process.stdout.write(
    `\n${table(
      ['service', 'CPU µs / request', 'idle CPU %'],
      Object.entries(cpuPerRequestUs).map(([name, us]) => [name, us, idleCpuPercent[name] ?? '']),
    )}\n`,
  );
  return result;
}
