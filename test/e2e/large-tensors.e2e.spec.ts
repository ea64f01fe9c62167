import { create } from '@bufbuild/protobuf';
import { createClient } from '@infermesh/grpc';
import { buildIdentityModel } from '@infermesh/model-builder';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { createHash } from 'node:crypto';
import { API_KEY, type Fixture, metricValue, startFixture } from './support/system-fixture';

/** Elements of each large request's tensor: 16 MiB of FP32 each way. */
const ELEMENTS = 4 * 2 ** 20;
const CONCURRENT = 8;
const AUTH = { authorization: `Bearer ${API_KEY}` };
const TINY_INPUT = { name: 'input', shape: [1, 4], datatype: 'FP32', data: [1, 2, 3, 4] };

/** A tensor of ELEMENTS FP32 values of its own, by seed. */
function tensor(seed: number): Buffer {
  const values = new Float32Array(ELEMENTS);
  for (let i = 0; i < values.length; i += 1024) values[i] = seed * 1_000_003 + i;
  return Buffer.from(values.buffer);
}

const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

/**
 * The identity model, batching: the batcher holds its requests until eight can go together (or 10 s
 * passed), so that the large ones below would make one 128 MiB batch, twice what a message may carry.
 */
const IDENTITY = {
  ...buildIdentityModel(['FP32'], 'identity'),
  batching: { maxBatchSize: 8, preferredBatchSizes: [8], maxQueueDelayUs: 10_000_000n },
};
/** The fewest batches that carry CONCURRENT requests of 16 MiB within a 64 MiB message each. */
const FEWEST_BATCHES = Math.ceil(CONCURRENT / Math.floor(64 / 16 - 0.01));

/**
 * Large tensors through the whole system, several at once, beside clients of small ones. Before, two
 * to four concurrent 16 MiB requests stalled every hop that carried them both ways at once until their
 * deadline (Node's HTTP/2 stops reading a connection while its writes wait, and the 16 MiB windows let
 * each side write more than the sockets hold), the batcher took its worker for unreachable when its
 * poll waited behind them, and batches of five or more such requests (over 64 MiB) were refused whole.
 */
describe('large tensors through the whole system', () => {
  let fixture: Fixture;

  beforeAll(async () => {
    fixture = await startFixture({ models: ['tiny', IDENTITY] });
  });

  afterAll(async () => {
    await fixture?.stop();
  });

  it(`answers ${CONCURRENT} concurrent 16 MiB requests (REST and gRPC) whole, while small requests beside them fail none`, async () => {
    const grpc = createClient(GRPCInferenceService, fixture.system.gatewayGrpcAddress);
    let running = true;
    let small = 0;
    const smallFailures: string[] = [];
    const smallClients = Array.from({ length: 4 }, async () => {
      while (running) {
        small += 1;
        const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/tiny/infer`, {
          method: 'POST',
          headers: { ...AUTH, 'content-type': 'application/json' },
          body: JSON.stringify({ inputs: [TINY_INPUT] }),
        }).catch((error: unknown) => ({ status: -1, text: () => Promise.resolve(String(error)) }));
        if (res.status !== 200) smallFailures.push(`${res.status} ${(await res.text()).slice(0, 200)}`);
      }
    });

    const started = Date.now();
    const outcomes = await Promise.all(
      Array.from({ length: CONCURRENT }, async (_, i) => {
        const input = tensor(i + 1);
        if (i % 2 === 0) {
          const response = await grpc
            .modelInfer(
              create(ModelInferRequestSchema, {
                modelName: 'identity',
                inputs: [{ name: 'fp32_in', datatype: 'FP32', shape: [1n, BigInt(ELEMENTS)] }],
                rawInputContents: [input],
              }),
              { metadata: AUTH, timeoutMs: 120_000 },
            )
            .catch((error: unknown) => error as Error);
          if (response instanceof Error) return `gRPC ${i}: ${response.message.slice(0, 200)}`;
          return sha256(response.rawOutputContents[0]!) === sha256(input) ? 'ok' : `gRPC ${i}: other bytes`;
        }
        const json = JSON.stringify({
          inputs: [
            {
              name: 'fp32_in',
              shape: [1, ELEMENTS],
              datatype: 'FP32',
              parameters: { binary_data_size: input.length },
            },
          ],
          parameters: { binary_data_output: true },
        });
        const res = await fetch(`${fixture.system.gatewayUrl}/v2/models/identity/infer`, {
          method: 'POST',
          headers: {
            ...AUTH,
            'content-type': 'application/octet-stream',
            'inference-header-content-length': String(json.length),
            'x-request-timeout-ms': '120000',
          },
          body: Buffer.concat([Buffer.from(json), input]),
        });
        const body = Buffer.from(await res.arrayBuffer());
        if (res.status !== 200) return `REST ${i}: ${res.status} ${body.subarray(0, 200).toString()}`;
        const headerLength = Number(res.headers.get('inference-header-content-length'));
        return sha256(body.subarray(headerLength)) === sha256(input) ? 'ok' : `REST ${i}: other bytes`;
      }),
    );
    const elapsedMs = Date.now() - started;
    running = false;
    await Promise.all(smallClients);
    grpc.close();

    const batches = await metricValue(fixture.system.metricsUrl('batcher'), 'infermesh_batcher_batch_size_count', {
      model: 'identity',
    });
    process.stdout.write(
      `large tensors: ${outcomes.filter((o) => o === 'ok').length} of ${CONCURRENT} answered whole in ${elapsedMs} ms, in ${batches} batches; small requests beside them: ${small} sent, ${smallFailures.length} failed\n`,
    );
    expect(outcomes.filter((o) => o !== 'ok')).toEqual([]);
    expect(smallFailures.slice(0, 5)).toEqual([]);
    expect(small).toBeGreaterThan(CONCURRENT);
    expect(batches).toBeGreaterThanOrEqual(FEWEST_BATCHES);
  });
});
