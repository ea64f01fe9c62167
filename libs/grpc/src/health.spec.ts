import { status } from '@grpc/grpc-js';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import { createClient } from './grpc-client';
import { GrpcServer } from './grpc-server';
import { HealthService, ServingStatus } from './health';
import type { ServiceClient } from './method-types';
import { RpcError } from './rpc-error';

const REGISTRY = 'infermesh.registry.v1.RegistryService';

describe(HealthService.name, () => {
  let sut: HealthService;
  let server: GrpcServer;
  let client: ServiceClient<typeof Health>;

  beforeEach(async () => {
    sut = new HealthService();
    server = new GrpcServer({
      logger: new JsonLogger('test', 'error', () => undefined),
      metrics: new Metrics('test'),
      maxMessageBytes: 1024 * 1024,
    });
    server.add(Health, sut);
    const port = await server.listen('127.0.0.1', 0);
    client = createClient(Health, `127.0.0.1:${port}`);
  });

  afterEach(async () => {
    client.close();
    await server.shutdown(100);
  });

  describe('check', () => {
    it('answers NOT_FOUND, naming the service, for a service never set', async () => {
      const error = await client.check({ service: 'nope.v1.Nope' }).then(
        () => undefined,
        (e: unknown) => e,
      );

      expect(error).toBeInstanceOf(RpcError);
      expect((error as RpcError).code).toBe(status.NOT_FOUND);
      expect((error as RpcError).message).toContain('"nope.v1.Nope"');
    });

    it('answers the status last set for the server and for each service', async () => {
      sut.set('', ServingStatus.SERVING);
      sut.set(REGISTRY, ServingStatus.NOT_SERVING);

      expect((await client.check({ service: '' })).status).toBe(ServingStatus.SERVING);
      expect((await client.check({ service: REGISTRY })).status).toBe(ServingStatus.NOT_SERVING);

      sut.set(REGISTRY, ServingStatus.SERVING);
      expect((await client.check({ service: REGISTRY })).status).toBe(ServingStatus.SERVING);
    });
  });

  describe('get', () => {
    it('reports SERVICE_UNKNOWN for a service never set, and the server by default', () => {
      sut.set('', ServingStatus.NOT_SERVING);

      expect(sut.get('nope')).toBe(ServingStatus.SERVICE_UNKNOWN);
      expect(sut.get()).toBe(ServingStatus.NOT_SERVING);
    });
  });

  describe('setAll', () => {
    it('sets the server and every registered service, the server included when it was never set', async () => {
      sut.set(REGISTRY, ServingStatus.SERVING);
      sut.set('infermesh.cache.v1.CacheService', ServingStatus.SERVING);

      sut.setAll(ServingStatus.NOT_SERVING);

      const { statuses } = await client.list({});
      expect(Object.fromEntries(Object.entries(statuses).map(([name, s]) => [name, s.status]))).toEqual({
        '': ServingStatus.NOT_SERVING,
        [REGISTRY]: ServingStatus.NOT_SERVING,
        'infermesh.cache.v1.CacheService': ServingStatus.NOT_SERVING,
      });
    });
  });

  describe('list', () => {
    it('lists nothing before any status is set', async () => {
      expect((await client.list({})).statuses).toEqual({});
    });

    it('lists every service with its status', async () => {
      sut.set('', ServingStatus.SERVING);
      sut.set(REGISTRY, ServingStatus.NOT_SERVING);

      const { statuses } = await client.list({});

      expect(statuses['']?.status).toBe(ServingStatus.SERVING);
      expect(statuses[REGISTRY]?.status).toBe(ServingStatus.NOT_SERVING);
      expect(Object.keys(statuses).sort()).toEqual(['', REGISTRY]);
    });
  });

  describe('watch', () => {
    it('sends the current status, then each change of the watched service only', async () => {
      sut.set(REGISTRY, ServingStatus.SERVING);
      const stream = client.watch({ service: REGISTRY })[Symbol.asyncIterator]();

      try {
        expect((await stream.next()).value?.status).toBe(ServingStatus.SERVING);

        sut.set('infermesh.cache.v1.CacheService', ServingStatus.NOT_SERVING); // another service: not sent
        sut.set(REGISTRY, ServingStatus.SERVING); // no change: not sent
        sut.set(REGISTRY, ServingStatus.NOT_SERVING);
        expect((await stream.next()).value?.status).toBe(ServingStatus.NOT_SERVING);

        sut.setAll(ServingStatus.SERVING);
        expect((await stream.next()).value?.status).toBe(ServingStatus.SERVING);
      } finally {
        await stream.return?.();
      }
    });

    it('sends SERVICE_UNKNOWN for a service not yet set, then its status once it is set', async () => {
      const stream = client.watch({ service: REGISTRY })[Symbol.asyncIterator]();

      try {
        expect((await stream.next()).value?.status).toBe(ServingStatus.SERVICE_UNKNOWN);
        sut.set(REGISTRY, ServingStatus.SERVING);
        expect((await stream.next()).value?.status).toBe(ServingStatus.SERVING);
      } finally {
        await stream.return?.();
      }
    });

    it('keeps serving other watchers after one watcher goes away', async () => {
      sut.set('', ServingStatus.SERVING);
      const leaving = client.watch({ service: '' })[Symbol.asyncIterator]();
      const staying = client.watch({ service: '' })[Symbol.asyncIterator]();
      await leaving.next();
      await staying.next();

      await leaving.return?.();
      sut.set('', ServingStatus.NOT_SERVING);

      try {
        expect((await staying.next()).value?.status).toBe(ServingStatus.NOT_SERVING);
      } finally {
        await staying.return?.();
      }
    });
  });
});
