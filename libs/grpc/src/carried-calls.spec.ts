import * as grpc from '@grpc/grpc-js';
import { deferred, eventually } from '@infermesh/clock/waiting.testing';
import {
  CacheService,
  type LookupRequest,
  type LookupResponse,
  type StoreRequest,
} from '@infermesh/proto/gen/infermesh/cache/v1/cache_pb';
import { RouterService } from '@infermesh/proto/gen/infermesh/router/v1/router_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Histogram } from 'prom-client';
import {
  CARRIED_CALL_MAX_BYTES,
  CarriedCalls,
  type CarriedRequest,
  type CarriedResponse,
  checkCarrier,
} from './carried-calls';
import { createClient } from './grpc-client';
import { GrpcServer } from './grpc-server';
import type { CallContext, ServiceClient } from './method-types';
import { Errors, RpcError } from './rpc-error';
import { toServiceDefinition } from './service-definition';

const HISTOGRAM = 'infermesh_test_grpc_server_handling_seconds';

/** Calls the server recorded, by method label (Service/Method) and code (any code when not given). */
async function handled(metrics: Metrics, method: string, code?: string): Promise<number> {
  const histogram = metrics.registry.getSingleMetric(HISTOGRAM) as Histogram;
  const { values } = await histogram.get();
  return values
    .filter(
      (v) =>
        v.metricName === `${HISTOGRAM}_count` &&
        v.labels['method'] === method &&
        (code === undefined || v.labels['code'] === code),
    )
    .reduce((n, v) => n + v.value, 0);
}

/** The first byte of a lookup's key says what the scripted cache does with it. */
const key = (byte: number) => new Uint8Array(32).fill(byte);

describe(CarriedCalls.name, () => {
  let server: GrpcServer;
  let metrics: Metrics;
  let port: number;
  let client: ServiceClient<typeof CacheService>;
  let lookup: (request: LookupRequest, ctx: CallContext) => Promise<{ found: boolean }>;
  let streamsOpened: number;

  async function serve(at = 0): Promise<number> {
    metrics = new Metrics('test');
    server = new GrpcServer({
      logger: new JsonLogger('test', 'error', () => undefined),
      metrics,
      maxMessageBytes: 1 << 20,
    });
    server.add(
      CacheService,
      {
        lookup: (request: LookupRequest, ctx: CallContext) => lookup(request, ctx),
        store: async (_request: StoreRequest) => ({ stored: true }),
        watchKeys: async function* () {
          throw Errors.notImplemented('not a cache');
        },
      },
      { lookups: 'lookup', stores: 'store' },
    );
    return server.listen('127.0.0.1', at);
  }

  /** Serves again on the same port; resolves once a call reaches the new server (on a new stream). */
  async function servedAgain(): Promise<void> {
    await serve(port);
    lookup = async () => ({ found: true });
    const found = () =>
      client.lookup({ key: key(1) }).then(
        (r) => r.found,
        () => false,
      );
    await eventually(found);
  }

  beforeEach(async () => {
    streamsOpened = 0;
    lookup = async (request) => ({ found: request.key[0] === 1 });
    port = await serve();
    client = createClient(CacheService, `127.0.0.1:${port}`, { carried: { lookup: 'lookups' }, transport: null });
  });

  afterEach(async () => {
    client.close();
    await server.shutdown(100);
  });

  it('answers each call to its caller on one stream, in the order the calls end', async () => {
    const slow = deferred();
    lookup = async (request) => {
      if (request.key[0] === 9) await slow.promise;
      return { found: request.key[0] === 1 };
    };
    const first = client.lookup({ key: key(9) });
    const others = await Promise.all([client.lookup({ key: key(1) }), client.lookup({ key: key(2) })]);
    expect(others.map((r) => r.found)).toEqual([true, false]);
    slow.resolve();
    expect((await first).found).toBe(false);

    // Served as Lookup calls, each recorded as one; carried by a single stream, recorded when it ends.
    expect(await handled(metrics, 'CacheService/Lookup', 'OK')).toBe(3);
    client.close();
    await eventually(async () => (await handled(metrics, 'CacheService/Lookups')) === 1);
  });

  it("gives a failed call the handler's error: code, reason and retry delay", async () => {
    lookup = async () => {
      throw Errors.queueFull('the cache is busy', { retryDelayMs: 250 });
    };
    const error = await client.lookup({ key: key(3) }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RpcError);
    expect(error).toMatchObject({
      code: grpc.status.RESOURCE_EXHAUSTED,
      reason: 'QUEUE_FULL',
      retryDelayMs: 250,
      message: 'the cache is busy',
    });
    expect(await handled(metrics, 'CacheService/Lookup', 'RESOURCE_EXHAUSTED')).toBe(1);
    // The stream is not failed with it.
    lookup = async () => ({ found: true });
    expect((await client.lookup({ key: key(3) })).found).toBe(true);
  });

  it("fails a call at its deadline on both sides, the handler's signal aborted, while the stream goes on", async () => {
    let aborted: unknown;
    lookup = async (request, ctx) => {
      if (request.key[0] !== 7) return { found: true };
      await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
      aborted = ctx.signal.reason;
      return { found: true };
    };
    const started = Date.now();
    const late = client.lookup({ key: key(7) }, { timeoutMs: 150 }).catch((e: unknown) => e);
    expect((await client.lookup({ key: key(1) })).found).toBe(true);
    const error = await late;
    expect(error).toMatchObject({ code: grpc.status.DEADLINE_EXCEEDED });
    expect(Date.now() - started).toBeGreaterThanOrEqual(140);
    await eventually(() => aborted !== undefined);
    expect(aborted).toMatchObject({ code: grpc.status.DEADLINE_EXCEEDED });
    expect(await handled(metrics, 'CacheService/Lookup', 'DEADLINE_EXCEEDED')).toBe(1);
  });

  it('carries the request id and the deadline into the handler context', async () => {
    const seen: CallContext[] = [];
    lookup = async (_request, ctx) => {
      seen.push(ctx);
      return { found: false };
    };
    await client.lookup({ key: key(1) }, { timeoutMs: 5_000, metadata: { 'x-request-id': 'req-42' } });
    expect(seen[0]!.requestId).toBe('req-42');
    expect(seen[0]!.deadlineMs! - Date.now()).toBeGreaterThan(4_000);
    await expect(client.lookup({ key: key(1) }, { metadata: { 'x-tenant': 'a' } })).rejects.toThrow(
      /cannot send metadata x-tenant/,
    );
  });

  it('rejects a call cancelled by its signal at once; a call already cancelled is not sent', async () => {
    const hold = deferred();
    lookup = async () => {
      await hold.promise;
      return { found: true };
    };
    const controller = new AbortController();
    const pending = client.lookup({ key: key(4) }, { signal: controller.signal }).catch((e: unknown) => e);
    controller.abort();
    expect(await pending).toMatchObject({ code: grpc.status.CANCELLED });
    await expect(client.lookup({ key: key(4) }, { signal: controller.signal })).rejects.toMatchObject({
      code: grpc.status.CANCELLED,
    });
    hold.resolve();
  });

  it('tells the server of a call given up, where its stream method can say so: the call is cancelled there, not answered, and the stream goes on', async () => {
    const routerMetrics = new Metrics('test');
    const router = new GrpcServer({
      logger: new JsonLogger('test', 'error', () => undefined),
      metrics: routerMetrics,
      maxMessageBytes: 1 << 20,
    });
    const started = deferred();
    let signal: AbortSignal | undefined;
    router.add(
      RouterService,
      {
        infer: async ({ request }, ctx) => {
          if (request!.id === 'held') {
            signal = ctx.signal;
            started.resolve();
            await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
          }
          return { response: { id: request!.id } };
        },
      },
      { infers: 'infer' },
    );
    const routerPort = await router.listen('127.0.0.1', 0);
    const routerClient = createClient(RouterService, `127.0.0.1:${routerPort}`, {
      carried: { infer: 'infers' },
      transport: null,
    });
    try {
      const controller = new AbortController();
      const held = routerClient
        .infer({ request: { id: 'held' } }, { signal: controller.signal })
        .catch((e: unknown) => e);
      await started.promise;
      controller.abort();
      expect(await held).toMatchObject({ code: grpc.status.CANCELLED });
      await eventually(() => signal!.aborted);
      expect(signal!.reason).toMatchObject({ code: grpc.status.CANCELLED });
      await eventually(async () => (await handled(routerMetrics, 'RouterService/Infer', 'CANCELLED')) === 1);
      // On the same stream, the next call is answered.
      expect((await routerClient.infer({ request: { id: 'next' } })).response?.id).toBe('next');
      expect(await handled(routerMetrics, 'RouterService/Infers')).toBe(0);
    } finally {
      routerClient.close();
      await router.shutdown(100);
    }
  });

  it('on shutdown answers the calls in flight, then ends the stream; the next call opens another', async () => {
    const hold = deferred();
    const arrived = deferred();
    lookup = async (request) => {
      if (request.key[0] === 5) {
        arrived.resolve();
        await hold.promise;
      }
      return { found: true };
    };
    const inFlight = client.lookup({ key: key(5) });
    await arrived.promise;
    const started = Date.now();
    const stopped = server.shutdown(10_000);
    hold.resolve();
    expect((await inFlight).found).toBe(true);
    await stopped;
    // The stream ended once answered: the shutdown did not wait for its grace period.
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(await handled(metrics, 'CacheService/Lookups', 'OK')).toBe(1);

    await servedAgain();
  });

  it('fails the calls a stream carries when the server goes away (UNAVAILABLE, no reason: a transport failure, as a unary call fails), and recovers with it', async () => {
    const arrived = deferred();
    lookup = async () => {
      arrived.resolve();
      return new Promise(() => undefined); // never answers
    };
    const stranded = client.lookup({ key: key(6) }).catch((e: unknown) => e);
    await arrived.promise;
    await server.shutdown(0); // the grace period is over at once: the stream is cut
    expect(await stranded).toMatchObject({ code: grpc.status.UNAVAILABLE, reason: undefined });
    await expect(client.lookup({ key: key(1) })).rejects.toMatchObject({
      code: grpc.status.UNAVAILABLE,
      reason: undefined,
    });

    await servedAgain();
  });

  it('renews its stream: new calls go on a new one, the old one ends once it has answered', async () => {
    const raw = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    const definition = toServiceDefinition(CacheService)['lookups']!;
    const carried = new CarriedCalls(
      CacheService.method.lookup,
      () => {
        streamsOpened += 1;
        return raw.makeBidiStreamRequest(
          definition.path,
          definition.requestSerialize,
          definition.responseDeserialize,
        ) as grpc.ClientDuplexStream<CarriedRequest, CarriedResponse>;
      },
      () => undefined,
      0, // every call on a stream of its own
    );
    try {
      const answers = await Promise.all([1, 2, 1].map((b) => carried.call({ key: key(b) })));
      expect(answers.map((a) => (a as LookupResponse).found)).toEqual([true, false, true]);
      expect(streamsOpened).toBe(3);
      await eventually(async () => (await handled(metrics, 'CacheService/Lookups')) >= 2);
    } finally {
      carried.close();
      raw.close();
    }
  });

  it('sends the calls of one turn as one message and answers those that end in one turn as one, within CARRIED_MESSAGE_BYTES', async () => {
    const raw = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    const definition = toServiceDefinition(CacheService)['lookups']!;
    const sent: number[] = [];
    const received: number[] = [];
    const carried = new CarriedCalls(
      CacheService.method.lookup,
      () => {
        const stream = raw.makeBidiStreamRequest(
          definition.path,
          definition.requestSerialize,
          definition.responseDeserialize,
        ) as grpc.ClientDuplexStream<CarriedRequest, CarriedResponse>;
        const write = stream.write.bind(stream) as (message: CarriedRequest) => boolean;
        stream.write = ((message: CarriedRequest) => {
          sent.push(message.calls.length);
          return write(message);
        }) as typeof stream.write;
        stream.on('data', (message: CarriedResponse) => received.push(message.results.length));
        return stream;
      },
      () => undefined,
    );
    try {
      const answers = await Promise.all(Array.from({ length: 16 }, (_, i) => carried.call({ key: key(1 + (i % 2)) })));
      expect(answers.filter((a) => (a as LookupResponse).found)).toHaveLength(8);
      expect(sent).toEqual([16]);
      expect(received).toEqual([16]);

      // A call of a later turn goes in a message of its own.
      expect(((await carried.call({ key: key(1) })) as LookupResponse).found).toBe(true);
      expect(sent).toEqual([16, 1]);

      // Calls of about 0.6 MiB each: no message carries two (the server takes at most 1 MiB).
      const large = () => new Uint8Array(600_000).fill(1);
      sent.length = 0;
      const mixed = await Promise.all([key(2), large(), large(), key(1)].map((k) => carried.call({ key: k })));
      expect(mixed.map((a) => (a as LookupResponse).found)).toEqual([false, true, true, true]);
      expect(sent).toEqual([2, 2]);
    } finally {
      carried.close();
      raw.close();
    }
  });

  it('sends a request over CARRIED_CALL_MAX_BYTES as a call of its own, the others of its turn carried', async () => {
    const how: string[] = [];
    lookup = async (request, ctx) => {
      // A call of its own brings its metadata (grpc-js's user-agent); a carried one only what it carries.
      how.push(`${request.key.byteLength} ${ctx.metadata['user-agent'] === undefined ? 'carried' : 'call'}`);
      return { found: true };
    };
    const large = new Uint8Array(CARRIED_CALL_MAX_BYTES + 1).fill(1);
    const answers = await Promise.all([client.lookup({ key: key(1) }), client.lookup({ key: large })]);
    expect(answers.map((a) => a.found)).toEqual([true, true]);
    expect(how.sort()).toEqual([`${CARRIED_CALL_MAX_BYTES + 1} call`, '32 carried']);
  });

  it("keeps the calls sent together within half its channel's message limit, when that is under CARRIED_MESSAGE_BYTES", async () => {
    // A client sending messages of at most 512 KiB: three calls of 200 kB made in one turn fit it
    // one by one, not together.
    const small = createClient(CacheService, `127.0.0.1:${port}`, {
      carried: { lookup: 'lookups' },
      transport: null,
      maxMessageBytes: 512 * 1024,
    });
    try {
      const answers = await Promise.all([1, 2, 3].map(() => small.lookup({ key: new Uint8Array(200_000).fill(1) })));
      expect(answers.map((a) => a.found)).toEqual([true, true, true]);
    } finally {
      small.close();
    }
  });

  it('fails a call its request cannot be encoded for by itself, not the others of its turn nor the stream', async () => {
    const [bad, good] = await Promise.allSettled([
      client.lookup({ key: 'not bytes' as unknown as Uint8Array }),
      client.lookup({ key: key(1) }),
    ]);
    expect(bad).toMatchObject({
      status: 'rejected',
      reason: { code: grpc.status.INTERNAL, message: expect.stringMatching(/invalid bytes/) },
    });
    expect(good).toMatchObject({ status: 'fulfilled', value: { found: true } });
    expect((await client.lookup({ key: key(1) })).found).toBe(true);
  });

  it('refuses a call whose id is already in flight on its stream, serving the first', async () => {
    const hold = deferred();
    lookup = async () => {
      await hold.promise;
      return { found: true };
    };
    const raw = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    const definition = toServiceDefinition(CacheService)['lookups']!;
    const stream = raw.makeBidiStreamRequest(
      definition.path,
      definition.requestSerialize,
      definition.responseDeserialize,
    ) as grpc.ClientDuplexStream<CarriedRequest, CarriedResponse>;
    try {
      const results: CarriedResponse['results'] = [];
      stream.on('error', () => undefined); // cancelled below
      stream.on('data', (message: CarriedResponse) => results.push(...message.results));
      const call = { id: 7, request: { key: key(1) }, traceparent: '', tracestate: '', timeoutMs: 0, requestId: '' };
      stream.write({ calls: [call, call] });
      await eventually(() => results.length === 1);
      expect(results[0]).toMatchObject({ id: 7, status: { code: grpc.status.INVALID_ARGUMENT } });
      expect(results[0]!.status!.message).toContain('call 7 is already in flight on this stream');
      hold.resolve();
      await eventually(() => results.length === 2);
      expect(results[1]).toMatchObject({ id: 7, response: { found: true } });
    } finally {
      stream.cancel();
      raw.close();
    }
  });

  it('refuses a method pair that does not follow the convention, naming what is missing', () => {
    expect(() => checkCarrier(CacheService.method.lookups, CacheService.method.store)).toThrow(
      /cannot carry Store: infermesh.cache.v1.LookupsRequest.Call needs infermesh.cache.v1.StoreRequest request; infermesh.cache.v1.LookupsResponse.Result needs infermesh.cache.v1.StoreResponse response/,
    );
    expect(() => createClient(CacheService, '127.0.0.1:1', { carried: { store: 'lookup' }, transport: null })).toThrow(
      /Lookup is not bidirectional/,
    );
  });
});
