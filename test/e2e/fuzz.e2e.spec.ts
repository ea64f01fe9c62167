import { create, type DescMessage, type DescService, toBinary } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { BatcherService } from '@infermesh/proto/gen/infermesh/batcher/v1/batcher_pb';
import { CacheService } from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { DataType, type InferenceRequestSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { WorkerService } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { GRPCInferenceService } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { SERVICE_NAMES, type ServiceName } from '@infermesh/system';
import fc from 'fast-check';
import { readFileSync } from 'node:fs';
import { API_KEY, type Fixture, startFixture } from './support/system-fixture';

/** Statuses a hostile request may get; a 500 or 502 is a bug. */
const REST_OK = new Set([200, 400, 401, 403, 404, 405, 409, 413, 415, 429, 501, 503, 504]);
/** gRPC codes that say the server failed, rather than that the request was bad. */
const GRPC_BUGS = new Set([grpc.status.INTERNAL, grpc.status.UNKNOWN, grpc.status.DATA_LOSS]);
const FUZZ_SEED = Number(process.env['INFERMESH_FUZZ_SEED'] ?? Date.now() % 1_000_000);

const float32 = (values: number[]) => new Uint8Array(new Float32Array(values).buffer);

/** A valid internal inference request for the tiny model: the seed the mutations start from. */
const tinyRequest: Parameters<typeof create<typeof InferenceRequestSchema>>[1] = {
  modelName: 'tiny',
  modelVersion: '1',
  id: 'fuzz',
  inputs: [{ name: 'input', datatype: DataType.FP32, shape: [1n, 4n], data: float32([1, 2, 3, 4]) }],
};

/** Valid messages of each method's request type, by method path; others start from the empty message. */
function seedsOf(service: DescService): Map<string, Uint8Array[]> {
  const seeds = new Map<string, Uint8Array[]>();
  for (const method of service.methods) {
    const path = `/${service.typeName}/${method.name}`;
    const list = [toBinary(method.input, create(method.input))];
    const init = seedInit(method.input);
    if (init !== undefined) list.push(toBinary(method.input, create(method.input, init as never)));
    seeds.set(path, list);
  }
  return seeds;
}

function seedInit(schema: DescMessage): unknown {
  switch (schema.typeName) {
    case 'infermesh.router.v1.InferRequest':
    case 'infermesh.batcher.v1.InferRequest':
    case 'infermesh.worker.v1.InferRequest':
      return { request: tinyRequest };
    case 'inference.ModelInferRequest':
      return {
        modelName: 'tiny',
        inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 4n] }],
        rawInputContents: [float32([1, 2, 3, 4])],
      };
    case 'inference.ModelMetadataRequest':
    case 'inference.ModelReadyRequest':
      return { name: 'tiny' };
    case 'infermesh.cache.v1.LookupRequest':
      return { key: new Uint8Array(32) };
    case 'infermesh.cache.v1.LookupsRequest':
      return { calls: [{ id: 1, request: { key: new Uint8Array(32) }, timeoutMs: 1_000 }] };
    // Names of a model that does not exist, so that a mutation is unlikely to change the models served.
    case 'infermesh.worker.v1.LoadModelRequest':
    case 'infermesh.worker.v1.UnloadModelRequest':
      return { name: 'models/fuzzed/versions/1' };
    case 'infermesh.registry.v1.GetModelRequest':
    case 'infermesh.registry.v1.DeleteModelRequest':
      return { name: 'models/fuzzed' };
    case 'infermesh.registry.v1.ResolveModelVersionRequest':
      return { model: 'models/fuzzed', versionId: '1' };
    default:
      return undefined;
  }
}

/** Bytes that are a valid message with some bytes changed, some cut off, or some appended. */
const mutated = (seeds: Uint8Array[]) =>
  fc
    .tuple(
      fc.constantFrom(...seeds),
      fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }),
      fc.option(fc.nat(), { nil: undefined }),
      fc.uint8Array({ maxLength: 16 }),
    )
    .map(([seed, flips, cut, tail]) => {
      const bytes = Uint8Array.from(seed);
      for (const [at, value] of flips) if (bytes.length > 0) bytes[at % bytes.length] = value;
      const kept = cut === undefined || bytes.length === 0 ? bytes : bytes.subarray(0, cut % bytes.length);
      return Buffer.concat([kept, tail]);
    });

interface Outcome {
  code: grpc.status;
  details: string;
}

/** One call with raw request bytes; its status. Response streams are read to their end or deadline. */
function rawCall(
  client: grpc.Client,
  path: string,
  kind: string,
  bytes: Buffer,
  metadata: grpc.Metadata,
  deadlineMs: number,
): Promise<Outcome> {
  const identity = (b: Buffer) => b;
  const options = { deadline: Date.now() + deadlineMs };
  return new Promise((resolve) => {
    const done = (error: grpc.ServiceError | null) =>
      resolve(error === null ? { code: grpc.status.OK, details: '' } : { code: error.code, details: error.details });
    if (kind === 'unary') {
      client.makeUnaryRequest(path, identity, identity, bytes, metadata, options, (error) => done(error));
    } else if (kind === 'server_streaming') {
      const stream = client.makeServerStreamRequest(path, identity, identity, bytes, metadata, options);
      stream.on('data', () => undefined);
      stream.on('error', (error: grpc.ServiceError) => done(error));
      stream.on('end', () => done(null));
    } else if (kind === 'bidi_streaming') {
      const stream = client.makeBidiStreamRequest(path, identity, identity, metadata, options);
      stream.on('data', () => undefined);
      stream.on('error', (error: grpc.ServiceError) => done(error));
      stream.on('end', () => done(null));
      stream.write(bytes);
      stream.end();
    } else {
      const stream = client.makeClientStreamRequest(path, identity, identity, metadata, options, (error) =>
        done(error),
      );
      stream.write(bytes);
      stream.end();
    }
  });
}

/** Resident memory of a process, in bytes. */
function rssBytes(pid: number): number {
  const pages = Number(readFileSync(`/proc/${pid}/statm`, 'utf8').split(' ')[1]);
  return pages * 4096;
}

/**
 * Hostile input against the running system: thousands of malformed REST bodies at the gateway, and
 * malformed or mutated protobuf messages at every service's gRPC port. No process may crash, no
 * answer may be a 500 or INTERNAL, and memory stays flat. FUZZ_SEED is printed so a failure can be
 * replayed with INFERMESH_FUZZ_SEED.
 */
describe('fuzzing every port with malformed input', () => {
  let fixture: Fixture;
  let pids: Record<ServiceName, number>;

  beforeAll(async () => {
    fixture = await startFixture({ models: ['tiny', 'multi-io'] });
    pids = Object.fromEntries(SERVICE_NAMES.map((s) => [s, fixture.system.process(s).pid!])) as Record<
      ServiceName,
      number
    >;
    console.log(`fuzz seed ${FUZZ_SEED} (replay with INFERMESH_FUZZ_SEED=${FUZZ_SEED})`);
  }, 120_000);

  afterAll(async () => {
    await fixture?.stop();
  });

  const validInfer = () =>
    fetch(`${fixture.system.gatewayUrl}/v2/models/tiny/infer`, {
      method: 'POST',
      headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ inputs: [{ name: 'input', shape: [1, 4], datatype: 'FP32', data: [1, 2, 3, 4] }] }),
    });

  /** A model name: real ones for read and inference paths, never for paths that change models. */
  const modelName = fc.oneof(
    fc.constantFrom('tiny', 'multi-io', 'nope', '', '..', '%00', 'a%2Fb', 'x'.repeat(300)),
    fc.string({ maxLength: 12 }).map(encodeURIComponent),
  );
  const otherName = fc.oneof(
    fc.constantFrom('nope', 'fuzzed', '', '%00', 'x'.repeat(300)),
    fc.string({ maxLength: 12 }).map(encodeURIComponent),
  );
  const version = fc.oneof(
    fc.constantFrom('1', '2', '0', '-1', '01', '99999999999999999999'),
    fc.string({ maxLength: 6 }).map(encodeURIComponent),
  );
  const path = fc.oneof(
    fc.tuple(modelName, version).map(([m, v]) => `/v2/models/${m}/versions/${v}/infer`),
    modelName.map((m) => `/v2/models/${m}/infer`),
    modelName.map((m) => `/v2/models/${m}`),
    modelName.map((m) => `/v2/models/${m}/ready`),
    fc.constantFrom(
      '/v2',
      '/v2/health/ready',
      '/v2/health/live',
      '/v2/repository/index',
      '/admin/v1/models',
      '/admin/v1/artifacts',
      '/',
      '/v2/models',
    ),
    otherName.map((m) => `/v2/repository/models/${m}/load`),
    otherName.map((m) => `/v2/repository/models/${m}/unload`),
    otherName.map((m) => `/admin/v1/models/${m}`),
    fc.tuple(otherName, version).map(([m, v]) => `/admin/v1/models/${m}/versions/${v}/retire`),
    otherName.map((m) => `/admin/v1/models/${m}/rollout`),
    fc.string({ maxLength: 40 }).map((s) => `/${encodeURIComponent(s)}`),
  );
  const tensor = fc.record(
    {
      name: fc.oneof(fc.constant('input'), fc.constant('x'), fc.anything()),
      shape: fc.oneof(
        fc.constant([1, 4]),
        fc.array(fc.oneof(fc.integer(), fc.double(), fc.string(), fc.constant(-1)), { maxLength: 5 }),
        fc.anything(),
      ),
      datatype: fc.oneof(
        fc.constantFrom('FP32', 'INT64', 'BOOL', 'BYTES', 'FP16', 'BF16', 'fp32', 'UINT8', ''),
        fc.anything(),
      ),
      data: fc.oneof(
        fc.constant([1, 2, 3, 4]),
        fc.array(
          fc.oneof(
            fc.double(),
            fc.integer(),
            fc.string(),
            fc.boolean(),
            fc.constant(null),
            fc.constantFrom('NaN', 'Infinity', '1e999'),
          ),
          { maxLength: 16 },
        ),
        fc.anything(),
      ),
      parameters: fc.anything(),
    },
    { requiredKeys: [] },
  );
  const body = fc.oneof(
    fc
      .record(
        {
          inputs: fc.oneof(fc.array(tensor, { maxLength: 3 }), fc.anything()),
          outputs: fc.anything(),
          id: fc.anything(),
          parameters: fc.anything(),
        },
        { requiredKeys: [] },
      )
      .map((o) => JSON.stringify(o)),
    fc.json().map(String),
    fc.string({ maxLength: 200 }),
    fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)),
    fc.nat({ max: 2_000 }).map((depth) => '['.repeat(depth) + ']'.repeat(depth)),
    fc.constant(''),
  );
  const request = fc.record({
    method: fc.constantFrom('GET', 'POST', 'POST', 'POST', 'PUT', 'PATCH', 'DELETE'),
    path,
    body,
    auth: fc.constantFrom(
      `Bearer ${API_KEY}`,
      `Bearer ${API_KEY}`,
      'Bearer wrong',
      'Basic abc',
      '',
      `bearer ${API_KEY} extra`,
    ),
    contentType: fc.constantFrom(
      'application/json',
      'application/octet-stream',
      'text/plain',
      'application/json; charset=latin1',
      '',
    ),
    timeout: fc.option(fc.oneof(fc.constantFrom('0', '-5', 'abc', '1e9', '100'), fc.string({ maxLength: 5 })), {
      nil: undefined,
    }),
    routingKey: fc.option(fc.string({ maxLength: 300 }), { nil: undefined }),
  });

  it('answers thousands of malformed REST requests with a 4xx or a clear 5xx, never a 500, with an error body', async () => {
    const restRound = async (runs: number, seed: number) => {
      await fc.assert(
        fc.asyncProperty(request, async (r) => {
          const headers: Record<string, string> = {};
          if (r.auth !== '') headers['authorization'] = r.auth;
          if (r.contentType !== '') headers['content-type'] = r.contentType;
          if (r.timeout !== undefined) headers['x-request-timeout-ms'] = r.timeout;
          if (r.routingKey !== undefined) headers['x-routing-key'] = encodeURIComponent(r.routingKey);
          const res = await fetch(`${fixture.system.gatewayUrl}${r.path}`, {
            method: r.method,
            headers,
            ...(r.method !== 'GET' && { body: r.body }),
            signal: AbortSignal.timeout(20_000),
          });
          const text = await res.text();
          if (!REST_OK.has(res.status))
            throw new Error(`${r.method} ${r.path} answered ${res.status}: ${text.slice(0, 300)}`);
          if (res.status >= 400) {
            let parsed: unknown;
            try {
              parsed = JSON.parse(text);
            } catch {
              throw new Error(
                `${r.method} ${r.path} answered ${res.status} without a JSON body: ${text.slice(0, 200)}`,
              );
            }
            if (typeof (parsed as { error?: unknown }).error !== 'string')
              throw new Error(`${r.method} ${r.path} answered ${res.status} without "error": ${text.slice(0, 200)}`);
          }
        }),
        { numRuns: runs, seed, endOnFailure: true },
      );
    };
    await restRound(500, FUZZ_SEED);
    const gatewayAfterWarmUp = rssBytes(pids.gateway);
    await restRound(2_000, FUZZ_SEED + 1);
    const growth = rssBytes(pids.gateway) - gatewayAfterWarmUp;
    console.log(
      `gateway resident memory grew ${(growth / 2 ** 20).toFixed(1)} MiB over 2,000 fuzzed requests after 500 to warm up`,
    );
    expect(growth).toBeLessThan(64 * 2 ** 20);
    expect((await validInfer()).status).toBe(200);
  }, 120_000);

  it('answers mutated and malformed protobuf messages on every gRPC port without INTERNAL', async () => {
    const targets: { service: ServiceName; address: string; services: DescService[] }[] = [
      {
        service: 'gateway',
        address: fixture.system.gatewayGrpcAddress,
        services: [GRPCInferenceService, RegistryService, Health],
      },
      { service: 'registry', address: fixture.system.grpcAddress('registry'), services: [RegistryService, Health] },
      { service: 'router', address: fixture.system.grpcAddress('router'), services: [RouterService, Health] },
      { service: 'cache', address: fixture.system.grpcAddress('cache'), services: [CacheService, Health] },
      { service: 'batcher', address: fixture.system.grpcAddress('batcher'), services: [BatcherService, Health] },
      { service: 'worker', address: fixture.system.grpcAddress('worker'), services: [WorkerService, Health] },
    ];
    const metadata = new grpc.Metadata();
    metadata.set('authorization', `Bearer ${API_KEY}`);
    let calls = 0;
    for (const target of targets) {
      const client = new grpc.Client(target.address, grpc.credentials.createInsecure());
      try {
        for (const service of target.services) {
          const seeds = seedsOf(service);
          for (const method of service.methods) {
            // Health.Watch and WatchModels stream until cancelled: a deadline is their normal end.
            const endless = method.methodKind === 'server_streaming' && /Watch/.test(method.name);
            const path = `/${service.typeName}/${method.name}`;
            await fc.assert(
              fc.asyncProperty(
                fc.oneof(
                  mutated(seeds.get(path)!),
                  fc.uint8Array({ maxLength: 256 }).map((b) => Buffer.from(b)),
                ),
                async (bytes) => {
                  calls += 1;
                  const outcome = await rawCall(
                    client,
                    path,
                    method.methodKind,
                    bytes,
                    metadata,
                    endless ? 300 : 5_000,
                  );
                  if (GRPC_BUGS.has(outcome.code))
                    throw new Error(
                      `${target.service} ${path} answered ${grpc.status[outcome.code]}: ${outcome.details}`,
                    );
                  if (outcome.code === grpc.status.DEADLINE_EXCEEDED && !endless)
                    throw new Error(`${target.service} ${path} left a call without an answer until its deadline`);
                },
              ),
              { numRuns: endless ? 3 : 60, seed: FUZZ_SEED, endOnFailure: true },
            );
          }
        }
      } finally {
        client.close();
      }
    }
    console.log(`${calls} fuzzed gRPC calls`);
    expect(calls).toBeGreaterThan(1_000);
  }, 240_000);

  it('leaves every process running, and the system still serves', async () => {
    for (const service of SERVICE_NAMES) {
      expect({
        service,
        running: fixture.system.process(service).running,
        pid: fixture.system.process(service).pid,
      }).toEqual({
        service,
        running: true,
        pid: pids[service],
      });
    }
    expect((await validInfer()).status).toBe(200);
  });
});
