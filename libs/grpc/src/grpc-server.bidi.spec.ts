import * as grpc from '@grpc/grpc-js';
import { status } from '@grpc/grpc-js';
import {
  ServerReflection,
  type ServerReflectionRequest,
  type ServerReflectionResponse,
} from '@infermesh/proto/gen/grpc/reflection/v1/reflection_pb';
import { JsonLogger, Metrics } from '@infermesh/telemetry';
import type { Histogram } from 'prom-client';
import { GrpcServer } from './grpc-server';
import type { CallContext, ServiceImpl } from './method-types';
import { RpcError, Errors } from './rpc-error';
import { toServiceDefinition } from './service-definition';
import { deferred, eventually } from '@infermesh/clock/waiting.testing';

// ServerReflection is the bidirectional service at hand; here it is only a request and a response
// type, each handler scripted by its test.
type Impl = ServiceImpl<typeof ServerReflection>;
type Duplex = grpc.ClientDuplexStream<Partial<ServerReflectionRequest>, ServerReflectionResponse>;

const METHOD = 'ServerReflection/ServerReflectionInfo';
const PATH = '/grpc.reflection.v1.ServerReflection/ServerReflectionInfo';
const HISTOGRAM = 'infermesh_test_grpc_server_handling_seconds';

/** A request that carries `text` in its host field; the echo handlers answer with it. */
const ask = (text: string): Partial<ServerReflectionRequest> => ({ host: text });

/** Reads a stream to its end; resolves with the messages and the error it ended with, if any. */
async function drain(
  call: Duplex,
): Promise<{ messages: ServerReflectionResponse[]; error: grpc.ServiceError | undefined }> {
  const messages: ServerReflectionResponse[] = [];
  try {
    for await (const message of call as AsyncIterable<ServerReflectionResponse>) messages.push(message);
    return { messages, error: undefined };
  } catch (error) {
    return { messages, error: error as grpc.ServiceError };
  }
}

describe(GrpcServer.name, () => {
  describe('bidirectional streaming', () => {
    let sut: GrpcServer;
    let metrics: Metrics;
    let logs: string[];
    let address: string;
    let raw: grpc.Client;
    let onInfo: Impl['serverReflectionInfo'];
    let seen: CallContext[];

    beforeEach(async () => {
      metrics = new Metrics('test');
      logs = [];
      seen = [];
      onInfo = async function* (requests) {
        for await (const request of requests) yield { validHost: request.host };
      };
      sut = new GrpcServer({
        logger: new JsonLogger('test', 'error', (line) => logs.push(line)),
        metrics,
        maxMessageBytes: 4 * 1024 * 1024,
      });
      const impl: Impl = {
        serverReflectionInfo: (requests, ctx) => {
          seen.push(ctx);
          return onInfo(requests, ctx);
        },
      };
      sut.add(ServerReflection, impl);
      address = `127.0.0.1:${await sut.listen('127.0.0.1', 0)}`;
      const Ctor = grpc.makeGenericClientConstructor(toServiceDefinition(ServerReflection), 'ServerReflection');
      raw = new Ctor(address, grpc.credentials.createInsecure());
    });

    afterEach(async () => {
      raw.close();
      await sut.shutdown(100);
    });

    const open = (metadata = new grpc.Metadata()): Duplex =>
      (raw as unknown as { serverReflectionInfo(metadata: grpc.Metadata): Duplex }).serverReflectionInfo(metadata);

    async function handledCount(method: string, code: string): Promise<number> {
      const histogram = metrics.registry.getSingleMetric(HISTOGRAM) as Histogram | undefined;
      const values = (await histogram?.get())?.values ?? [];
      const sample = values.find(
        (v) => v.metricName === `${HISTOGRAM}_count` && v.labels['method'] === method && v.labels['code'] === code,
      );
      return sample?.value ?? 0;
    }

    it('answers each request while the client goes on sending, and ends OK when both sides are done', async () => {
      const call = open(new grpc.Metadata());
      const responses = (call as AsyncIterable<ServerReflectionResponse>)[Symbol.asyncIterator]();

      call.write(ask('first'));
      const first = await responses.next();
      call.write(ask('second'));
      const second = await responses.next();
      call.end();
      const end = await responses.next();

      expect(first.value).toMatchObject({ validHost: 'first' });
      expect(second.value).toMatchObject({ validHost: 'second' });
      expect(end.done).toBe(true);
      expect(await handledCount(METHOD, 'OK')).toBe(1);
    });

    it('gives the handler the call context: metadata and request id', async () => {
      const metadata = new grpc.Metadata();
      metadata.set('x-request-id', 'req-bidi');
      metadata.set('authorization', 'Bearer k');
      const call = open(metadata);

      call.end();
      await drain(call);

      expect(seen[0]?.requestId).toBe('req-bidi');
      expect(seen[0]?.metadata['authorization']).toBe('Bearer k');
    });

    it('keeps answering after the handler stopped reading requests, the client still sending', async () => {
      onInfo = async function* (requests) {
        for await (const request of requests) {
          yield { validHost: `last read: ${request.host}` };
          break;
        }
        yield { validHost: 'after 1' };
        yield { validHost: 'after 2' };
      };
      const call = open();

      call.write(ask('one'));
      call.write(ask('two'));
      const { messages, error } = await drain(call);

      expect(error).toBeUndefined();
      expect(messages.map((m) => m.validHost)).toEqual(['last read: one', 'after 1', 'after 2']);
    });

    it('delivers the responses sent before the handler failed, then its RpcError', async () => {
      onInfo = async function* (requests) {
        for await (const request of requests) {
          if (request.host === 'bad') throw Errors.modelNotFound('no such model "bad"');
          yield { validHost: request.host };
        }
      };
      const call = open();

      call.write(ask('good'));
      call.write(ask('bad'));
      const { messages, error } = await drain(call);

      expect(messages.map((m) => m.validHost)).toEqual(['good']);
      expect(error?.code).toBe(status.NOT_FOUND);
      expect(error?.details).toBe('no such model "bad"');
      expect(RpcError.fromServiceError(error!).reason).toBe('MODEL_NOT_FOUND');
      expect(logs).toEqual([]);
      expect(await handledCount(METHOD, 'NOT_FOUND')).toBe(1);
    });

    it('turns any other thrown error into INTERNAL "internal error" without leaking its message, and logs it', async () => {
      onInfo = async function* () {
        yield* [];
        throw new Error('secret stack detail');
      };
      const call = open();

      call.end();
      const { error } = await drain(call);

      expect(error?.code).toBe(status.INTERNAL);
      expect(error?.details).toBe('internal error');
      expect(logs.join('\n')).toContain('ServerReflection/ServerReflectionInfo failed');
    });

    it('refuses a request whose bytes do not decode with INVALID_ARGUMENT naming the message', async () => {
      // Field 1 (a string) with length 200 but 3 bytes: truncated.
      const truncated = Buffer.from([0x0a, 0xc8, 0x01, 0x61, 0x62, 0x63]);
      const client = new grpc.Client(address, grpc.credentials.createInsecure());
      const identity = (b: Buffer) => b;
      const call = client.makeBidiStreamRequest(PATH, identity, identity) as unknown as Duplex;

      (call as unknown as grpc.ClientDuplexStream<Buffer, Buffer>).write(truncated);
      const { error } = await drain(call);
      client.close();

      expect(error?.code).toBe(status.INVALID_ARGUMENT);
      expect(error?.details).toMatch(/^malformed grpc\.reflection\.v1\.ServerReflectionRequest message: /);
    });

    it('surfaces CANCELLED to the handler reading requests, and aborts ctx.signal, when the client cancels', async () => {
      const firstRead = deferred();
      let handlerError: unknown;
      onInfo = async function* (requests) {
        try {
          for await (const request of requests) {
            firstRead.resolve();
            yield { validHost: request.host };
          }
        } catch (error) {
          handlerError = error;
          throw error;
        }
      };
      const call = open();
      call.on('error', () => undefined);

      call.write(ask('one'));
      await firstRead.promise;
      call.cancel();

      await eventually(() => handlerError !== undefined);
      expect((handlerError as RpcError).code).toBe(status.CANCELLED);
      expect(seen[0]?.signal.aborted).toBe(true);
      await eventually(() => logs.length === 0);
    });

    it('carries many large responses while the client sends, each intact and in order', async () => {
      const total = 200;
      onInfo = async function* (requests) {
        for await (const request of requests) {
          const n = Number(request.host);
          yield {
            validHost: request.host,
            messageResponse: {
              case: 'fileDescriptorResponse',
              value: { fileDescriptorProto: [new Uint8Array(64 * 1024).fill(n & 0xff)] },
            },
          };
        }
      };
      const call = open();

      for (let n = 0; n < total; n++) call.write(ask(String(n)));
      call.end();
      const { messages, error } = await drain(call);

      expect(error).toBeUndefined();
      expect(messages.map((m) => m.validHost)).toEqual(Array.from({ length: total }, (_, n) => String(n)));
      const intact = messages.every((m, n) => {
        const bytes =
          m.messageResponse.case === 'fileDescriptorResponse'
            ? m.messageResponse.value.fileDescriptorProto[0]
            : undefined;
        return bytes?.length === 64 * 1024 && bytes.every((b) => b === (n & 0xff));
      });
      expect(intact).toBe(true);
    });
  });
});
