import { create, createFileRegistry, fromBinary, type MessageInitShape, toBinary, toJson } from '@bufbuild/protobuf';
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';
import * as grpc from '@grpc/grpc-js';
import { loadFileDescriptorSetFromBuffer } from '@grpc/proto-loader';
import { status } from '@grpc/grpc-js';
import { createClient } from '@infermesh/grpc';
import { Health } from '@infermesh/proto/gen/grpc/health/v1/health_pb';
import {
  type ServerReflectionResponse,
  ServerReflectionRequestSchema,
  ServerReflectionResponseSchema,
} from '@infermesh/proto/gen/grpc/reflection/v1/reflection_pb';
import { GRPCInferenceService, ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { ApiKeyService } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { RegistryService } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import type { RunningService } from '@infermesh/runtime';
import { ServerReflectionGrpcController } from './server-reflection';
import { type FakeUpstreams, startFakeUpstreams, startTestGateway } from './testing/gateway-harness';

type Request = MessageInitShape<typeof ServerReflectionRequestSchema>;

const KEY = 'reflection-spec-key-0123456789';

const SERVED = [
  'grpc.health.v1.Health',
  'grpc.reflection.v1.ServerReflection',
  'grpc.reflection.v1alpha.ServerReflection',
  'inference.GRPCInferenceService',
  'infermesh.gateway.v1.ApiKeyService',
  'infermesh.registry.v1.RegistryService',
];

const listServices: Request = { messageRequest: { case: 'listServices', value: '' } };
const symbol = (name: string): Request => ({ messageRequest: { case: 'fileContainingSymbol', value: name } });
const filename = (name: string): Request => ({ messageRequest: { case: 'fileByFilename', value: name } });

function servicesOf(response: ServerReflectionResponse | undefined): string[] {
  if (response?.messageResponse.case !== 'listServicesResponse')
    throw new Error(`expected a list_services_response, got ${response?.messageResponse.case}`);
  return response.messageResponse.value.service.map((s) => s.name);
}

function filesOf(response: ServerReflectionResponse | undefined) {
  if (response?.messageResponse.case !== 'fileDescriptorResponse')
    throw new Error(`expected a file_descriptor_response, got ${response?.messageResponse.case}`);
  return response.messageResponse.value.fileDescriptorProto.map((bytes) =>
    fromBinary(FileDescriptorProtoSchema, bytes),
  );
}

/** What a reflection client builds from a file_descriptor_response: the first file, its imports resolved among the others. */
function registryOf(response: ServerReflectionResponse | undefined) {
  const [first, ...rest] = filesOf(response);
  if (first === undefined) throw new Error('no file in the file_descriptor_response');
  return createFileRegistry(first, (name) => rest.find((file) => file.name === name));
}

function errorOf(response: ServerReflectionResponse | undefined) {
  if (response?.messageResponse.case !== 'errorResponse')
    throw new Error(`expected an error_response, got ${response?.messageResponse.case}`);
  return response.messageResponse.value;
}

/**
 * One reflection stream as grpcurl opens it, with a plain grpc-js client and the generated messages:
 * sends the requests, half-closes, and reads every answer. No API key. v1alpha has v1's messages
 * and field numbers, so the same messages serve both paths.
 */
async function reflect(
  address: string,
  requests: Request[],
  version: 'v1' | 'v1alpha' = 'v1',
): Promise<ServerReflectionResponse[]> {
  const client = new grpc.Client(address, grpc.credentials.createInsecure());
  try {
    const call = client.makeBidiStreamRequest(
      `/grpc.reflection.${version}.ServerReflection/ServerReflectionInfo`,
      (message: Request) =>
        Buffer.from(toBinary(ServerReflectionRequestSchema, create(ServerReflectionRequestSchema, message))),
      (bytes: Buffer) => fromBinary(ServerReflectionResponseSchema, bytes),
      new grpc.Metadata(),
      { deadline: Date.now() + 10_000 },
    );
    for (const request of requests) call.write(request);
    call.end();
    const responses: ServerReflectionResponse[] = [];
    for await (const response of call as AsyncIterable<ServerReflectionResponse>) responses.push(response);
    return responses;
  } finally {
    client.close();
  }
}

describe(ServerReflectionGrpcController.name, () => {
  const sut = new ServerReflectionGrpcController([Health, GRPCInferenceService, RegistryService, ApiKeyService]);
  const answer = (request: Request) => sut.answer(create(ServerReflectionRequestSchema, request));
  const fileNames = (request: Request) =>
    filesOf(create(ServerReflectionResponseSchema, answer(request))).map((f) => f.name);

  it('lists the services it was given and itself, v1 and v1alpha', () => {
    expect(servicesOf(create(ServerReflectionResponseSchema, answer(listServices)))).toEqual(SERVED);
  });

  it('finds the file of a service, method, message, field, nested enum, enum value, and of a fully-qualified name with a leading dot', () => {
    for (const name of [
      'infermesh.registry.v1.RegistryService',
      'infermesh.registry.v1.RegistryService.GetModel',
      'infermesh.registry.v1.GetModelRequest',
      'infermesh.registry.v1.GetModelRequest.name',
      'infermesh.registry.v1.VersionState',
      'infermesh.registry.v1.VERSION_STATE_READY',
      '.infermesh.registry.v1.RegistryService',
    ]) {
      expect([name, fileNames(symbol(name))[0]]).toEqual([name, 'infermesh/registry/v1/registry.proto']);
    }
  });

  it('sends a file first, then each file it imports, transitively and once', () => {
    const names = fileNames(filename('infermesh/registry/v1/registry.proto'));

    expect(names[0]).toBe('infermesh/registry/v1/registry.proto');
    expect(names).toEqual(
      expect.arrayContaining(['infermesh/inference/v1/inference.proto', 'google/protobuf/timestamp.proto']),
    );
    expect(new Set(names).size).toBe(names.length);
  });

  it('knows the files and symbols of the imports too', () => {
    expect(fileNames(symbol('google.protobuf.Timestamp'))).toEqual(['google/protobuf/timestamp.proto']);
    expect(fileNames(filename('infermesh/inference/v1/inference.proto'))[0]).toBe(
      'infermesh/inference/v1/inference.proto',
    );
  });

  it('answers what it does not serve with NOT_FOUND, naming it', () => {
    const unknown = errorOf(
      create(ServerReflectionResponseSchema, answer(symbol('infermesh.router.v1.RouterService'))),
    );
    const missing = errorOf(
      create(ServerReflectionResponseSchema, answer(filename('infermesh/router/v1/router.proto'))),
    );

    expect(unknown).toMatchObject({
      errorCode: status.NOT_FOUND,
      errorMessage: expect.stringContaining('infermesh.router.v1.RouterService'),
    });
    expect(missing).toMatchObject({
      errorCode: status.NOT_FOUND,
      errorMessage: expect.stringContaining('infermesh/router/v1/router.proto'),
    });
  });
});

describe('server reflection on the gateway gRPC port', () => {
  let upstreams: FakeUpstreams;
  let gateway: RunningService;
  let address: string;

  beforeAll(async () => {
    upstreams = await startFakeUpstreams();
    gateway = await startTestGateway(upstreams.router.address, upstreams.registry.address, { GATEWAY_API_KEYS: KEY });
    address = `127.0.0.1:${gateway.grpcPort}`;
  });

  afterAll(async () => {
    await gateway?.stop();
    await upstreams?.stop();
  });

  it('lists, without an API key, exactly the services the port serves', async () => {
    const [listed] = await reflect(address, [listServices]);
    const health = createClient(Health, address);
    const { statuses } = await health.list({});
    health.close();

    expect(servicesOf(listed)).toEqual(SERVED);
    // Every service bootstrap hosts has its own health entry; Health itself is the one that has none.
    expect(
      Object.keys(statuses)
        .filter((name) => name !== '')
        .concat('grpc.health.v1.Health')
        .sort(),
    ).toEqual(SERVED);
  });

  it('returns a descriptor set from which GRPCInferenceService and its messages can be read and used', async () => {
    const [response] = await reflect(address, [symbol('inference.GRPCInferenceService')]);
    const files = filesOf(response);
    const registry = registryOf(response);

    const service = registry.getService('inference.GRPCInferenceService');
    expect(files[0]?.name).toBe('inference/grpc_service.proto');
    expect(service?.methods.map((m) => `${m.name}(${m.input.typeName}) ${m.methodKind}`)).toEqual([
      'ServerLive(inference.ServerLiveRequest) unary',
      'ServerReady(inference.ServerReadyRequest) unary',
      'ModelReady(inference.ModelReadyRequest) unary',
      'ServerMetadata(inference.ServerMetadataRequest) unary',
      'ModelMetadata(inference.ModelMetadataRequest) unary',
      'ModelInfer(inference.ModelInferRequest) unary',
    ]);
    // The reflected ModelInferRequest reads what a KServe v2 client sends: same fields, same numbers.
    const reflected = registry.getMessage('inference.ModelInferRequest')!;
    const sent = create(ModelInferRequestSchema, {
      modelName: 'tiny',
      id: '7',
      inputs: [{ name: 'input', datatype: 'FP32', shape: [1n, 4n] }],
      rawInputContents: [new Uint8Array([1, 2, 3, 4])],
    });
    expect(toJson(reflected, fromBinary(reflected, toBinary(ModelInferRequestSchema, sent)))).toEqual(
      toJson(ModelInferRequestSchema, sent),
    );
  });

  it('lets a client that knows only what reflection told it call the API, as grpcurl does', async () => {
    const [response] = await reflect(address, [symbol('inference.GRPCInferenceService')]);
    const set = toBinary(FileDescriptorSetSchema, create(FileDescriptorSetSchema, { file: filesOf(response) }));
    // A stub built by protobuf.js from the reflected descriptors alone, nothing generated from proto/.
    type Unary = (
      request: object,
      metadata: grpc.Metadata,
      callback: (error: grpc.ServiceError | null, reply: Record<string, unknown>) => void,
    ) => void;
    const loaded = grpc.loadPackageDefinition(loadFileDescriptorSetFromBuffer(Buffer.from(set))) as unknown as {
      inference: {
        GRPCInferenceService: new (
          address: string,
          credentials: grpc.ChannelCredentials,
        ) => grpc.Client & Record<'ServerLive' | 'ModelMetadata', Unary>;
      };
    };
    const client = new loaded.inference.GRPCInferenceService(address, grpc.credentials.createInsecure());
    const call = (method: 'ServerLive' | 'ModelMetadata', request: object, metadata = new grpc.Metadata()) =>
      new Promise<Record<string, unknown>>((resolve, reject) =>
        client[method](request, metadata, (error, reply) => (error ? reject(error) : resolve(reply))),
      );
    const authorized = new grpc.Metadata();
    authorized.set('authorization', `Bearer ${KEY}`);

    try {
      expect(await call('ServerLive', {})).toEqual({ live: true });
      expect(await call('ModelMetadata', { name: 'mlp' }, authorized)).toMatchObject({
        name: 'mlp',
        platform: 'onnxruntime_onnx',
        versions: ['2', '3'],
      });
      await expect(call('ModelMetadata', { name: 'mlp' })).rejects.toMatchObject({ code: status.UNAUTHENTICATED });
    } finally {
      client.close();
    }
  });

  it('sends the files an admin contract imports, so that its descriptor set is complete', async () => {
    const [bySymbol, byMethod] = await reflect(address, [
      symbol('infermesh.registry.v1.RegistryService'),
      symbol('infermesh.registry.v1.RegistryService.WatchModels'),
    ]);

    const registry = registryOf(bySymbol);
    expect(registry.getService('infermesh.registry.v1.RegistryService')?.method['watchModels']?.methodKind).toBe(
      'server_streaming',
    );
    expect(filesOf(byMethod).map((f) => f.name)).toEqual(filesOf(bySymbol).map((f) => f.name));
  });

  it('answers an unknown symbol or file, and the extension queries, in the stream, which goes on', async () => {
    const requests: Request[] = [
      symbol('inference.NoSuchService'),
      filename('nope.proto'),
      {
        messageRequest: {
          case: 'fileContainingExtension',
          value: { containingType: 'inference.ModelInferRequest', extensionNumber: 100 },
        },
      },
      { messageRequest: { case: 'allExtensionNumbersOfType', value: 'inference.ModelInferRequest' } },
      { host: 'localhost:8001', ...filename('inference/grpc_service.proto') },
    ];

    const responses = await reflect(address, requests);

    expect(responses.map((r) => r.messageResponse.case)).toEqual([
      'errorResponse',
      'errorResponse',
      'errorResponse',
      'errorResponse',
      'fileDescriptorResponse',
    ]);
    expect(responses.slice(0, 4).map((r) => errorOf(r).errorCode)).toEqual([
      status.NOT_FOUND,
      status.NOT_FOUND,
      status.UNIMPLEMENTED,
      status.UNIMPLEMENTED,
    ]);
    expect(errorOf(responses[0]).errorMessage).toContain('inference.NoSuchService');
    expect(responses[4]?.validHost).toBe('localhost:8001');
    expect(responses[4]?.originalRequest?.messageRequest).toEqual({
      case: 'fileByFilename',
      value: 'inference/grpc_service.proto',
    });
  });

  it('answers the older v1alpha clients the same way', async () => {
    const [listed, described] = await reflect(
      address,
      [listServices, symbol('inference.GRPCInferenceService')],
      'v1alpha',
    );

    expect(servicesOf(listed)).toEqual(SERVED);
    expect(filesOf(described)[0]?.service.map((s) => s.name)).toEqual(['GRPCInferenceService']);
  });
});
