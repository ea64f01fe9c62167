import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import {
  ReportTrafficRequestSchema,
  TrafficCountersSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { createRedisClient, type Redis, waitForRedis } from '@infermesh/redis';
import { emptyCounters, ROLLOUT_LATENCY_BOUNDS_SECONDS } from '@infermesh/rollout';
import { JsonLogger, LATENCY_BUCKETS_SECONDS } from '@infermesh/telemetry';
import { type RedisServer, startRedisServer, thrownBy } from '@infermesh/testing';
import { EmbeddedTrafficLedger, type TrafficLedger, trafficDeltas } from './traffic-ledger';
import { RedisTrafficLedger } from './traffic-ledger.redis';

const refusal = (call: () => unknown): RpcError => thrownBy(call, RpcError);

const counters = (
  requests: number,
  errors: number,
  latency: Record<number, number> = {},
  shadow: [number, number] = [0, 0],
) => {
  const c = emptyCounters(ROLLOUT_LATENCY_BOUNDS_SECONDS);
  for (const [i, n] of Object.entries(latency)) c.latencyCounts[Number(i)] = BigInt(n);
  return create(TrafficCountersSchema, {
    ...c,
    requests: BigInt(requests),
    errors: BigInt(errors),
    shadowItems: BigInt(shadow[0]),
    shadowAgreed: BigInt(shadow[1]),
  });
};

describe('TrafficLedger', () => {
  let server: RedisServer;
  const clients: Redis[] = [];

  beforeAll(async () => {
    server = await startRedisServer();
  });
  afterAll(async () => {
    for (const client of clients) client.disconnect();
    await server.stop();
  });

  const redisLedger = async (): Promise<RedisTrafficLedger> => {
    const client = createRedisClient(server.url, new JsonLogger('test', 'error'), 'test');
    clients.push(client);
    await waitForRedis(client, 5_000);
    return new RedisTrafficLedger(client, 'infermesh:test:');
  };

  describe.each<[string, () => Promise<TrafficLedger>]>([
    ['EmbeddedTrafficLedger', () => Promise.resolve(new EmbeddedTrafficLedger())],
    ['RedisTrafficLedger', redisLedger],
  ])('%s', (_name, open) => {
    it('sums the reports of every router per version, and reads zeros for a version never reported', async () => {
      const sut = await open();
      const model = `m${Math.random().toString(36).slice(2)}`;
      await sut.add([
        { modelId: model, versionId: '1', counters: counters(10, 1, { 3: 9 }, [4, 3]) },
        { modelId: model, versionId: '2', counters: counters(5, 0, { 16: 5 }) },
      ]);
      await sut.add([{ modelId: model, versionId: '1', counters: counters(2, 2) }]);

      const one = await sut.read(model, '1');
      expect(one).toMatchObject({ requests: 12n, errors: 3n, shadowItems: 4n, shadowAgreed: 3n });
      expect(one.latencyCounts[3]).toBe(9n);
      expect(one.latencyCounts).toHaveLength(ROLLOUT_LATENCY_BOUNDS_SECONDS.length + 1);
      expect((await sut.read(model, '2')).latencyCounts[16]).toBe(5n);
      expect(await sut.read(model, '3')).toMatchObject({ requests: 0n, errors: 0n });
    });
  });

  it('shares the counts between the replicas of a Redis ledger', async () => {
    const [a, b] = [await redisLedger(), await redisLedger()];
    await a.add([{ modelId: 'shared', versionId: '1', counters: counters(3, 0) }]);
    await b.add([{ modelId: 'shared', versionId: '1', counters: counters(4, 1) }]);

    expect(await a.read('shared', '1')).toMatchObject({ requests: 7n, errors: 1n });
  });
});

describe(trafficDeltas.name, () => {
  const report = (init: Parameters<typeof create<typeof ReportTrafficRequestSchema>>[1]) =>
    create(ReportTrafficRequestSchema, {
      reporter: 'router-1',
      latencyBoundsSeconds: [...ROLLOUT_LATENCY_BOUNDS_SECONDS],
      ...init,
    });

  it('reads each version named', () => {
    expect(trafficDeltas(report({ versions: [{ name: 'models/tiny/versions/2', counters: counters(1, 0) }] }))).toEqual(
      [{ modelId: 'tiny', versionId: '2', counters: counters(1, 0) }],
    );
  });

  it.each([
    ['other latency bounds', report({ latencyBoundsSeconds: [0.1, 1] }), 'latency_bounds_seconds is [0.1, 1]'],
    [
      "the services' histogram buckets (a router of an earlier release)",
      report({ latencyBoundsSeconds: LATENCY_BUCKETS_SECONDS }),
      'latency_bounds_seconds is 16 bounds from 0.0001 to 10; the registry counts under 134 bounds',
    ],
    ['a malformed name', report({ versions: [{ name: 'tiny/2' }] }), 'versions[0].name'],
    [
      'too many latency counts',
      report({
        versions: [{ name: 'models/tiny/versions/2', counters: { latencyCounts: new Array<bigint>(200).fill(1n) } }],
      }),
      'versions[0] has 200 latency counts',
    ],
  ])('refuses a report with %s', (_name, request, message) => {
    const error = refusal(() => trafficDeltas(request));
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toContain(message);
  });
});
