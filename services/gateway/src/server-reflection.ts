import {
  create,
  type DescFile,
  type DescService,
  fromBinary,
  type MessageInitShape,
  toBinary,
} from '@bufbuild/protobuf';
import { nestedTypes } from '@bufbuild/protobuf/reflect';
import { FileDescriptorProtoSchema } from '@bufbuild/protobuf/wkt';
import { status } from '@grpc/grpc-js';
import type { ServiceImpl } from '@infermesh/grpc';
import * as v1 from '@infermesh/proto/gen/grpc/reflection/v1/reflection_pb';
import * as v1alpha from '@infermesh/proto/gen/grpc/reflection/v1alpha/reflection_pb';
import { bind, type GrpcBinding } from '@infermesh/runtime';

type Response = MessageInitShape<typeof v1.ServerReflectionResponseSchema>;

/**
 * gRPC server reflection (grpc.reflection.v1 and its predecessor v1alpha) on the gateway's gRPC
 * port, so that grpcurl, Postman and the like can list the services and read their contracts without
 * a copy of `proto/`: `grpcurl -plaintext localhost:8001 list`, `grpcurl -plaintext localhost:8001
 * describe inference.GRPCInferenceService`.
 *
 * It needs no API key: a client has to discover the API before it can use one, and reflection tells
 * only what the public contracts in `proto/` tell: the names, messages and field numbers of the
 * services this port serves. Every call of those services still needs its key.
 *
 * Answers come from the descriptors protoc-gen-es generated, so they are the contracts the gateway
 * was built with. A file is sent with all the files it imports, transitively; a symbol or file that
 * is not known, and the extension queries (no served contract declares an extension), are answered
 * with an error_response on the stream, which goes on.
 */
export class ServerReflectionGrpcController {
  /** The served service names, sorted. */
  private readonly serviceNames: string[];
  /** Every file of the served services and their imports, by file name. */
  private readonly files = new Map<string, DescFile>();
  /** The file that declares each fully-qualified symbol: services, methods, messages, fields, enums, enum values, extensions. */
  private readonly symbols = new Map<string, DescFile>();
  private readonly encoded = new Map<DescFile, Uint8Array>();

  readonly v1: ServiceImpl<typeof v1.ServerReflection> = {
    serverReflectionInfo: (requests) => this.answerEach(requests),
  };

  /** v1alpha has v1's messages and field numbers under another package: its requests are answered as v1's. */
  readonly v1alpha: ServiceImpl<typeof v1alpha.ServerReflection> = {
    serverReflectionInfo: (requests) => this.answerEachV1alpha(requests),
  };

  /**
   * @param services what the port serves besides the reflection services, which are added: its
   *   reflection lists exactly these, and describes them and everything their files import.
   */
  constructor(services: readonly DescService[]) {
    const all = [...services, v1.ServerReflection, v1alpha.ServerReflection];
    this.serviceNames = [...new Set(all.map((s) => s.typeName))].sort();
    for (const service of all) this.addFile(service.file);
  }

  /** The two reflection services, to be hosted on the port whose services were given. */
  bindings(): GrpcBinding[] {
    return [bind(v1.ServerReflection, this.v1), bind(v1alpha.ServerReflection, this.v1alpha)];
  }

  /** The answer to one request of the stream. */
  answer(request: v1.ServerReflectionRequest): Response {
    const base = { validHost: request.host, originalRequest: request };
    const query = request.messageRequest;
    switch (query.case) {
      case 'listServices':
        return {
          ...base,
          messageResponse: {
            case: 'listServicesResponse',
            value: { service: this.serviceNames.map((name) => ({ name })) },
          },
        };
      case 'fileByFilename': {
        const file = this.files.get(query.value);
        return file
          ? { ...base, ...this.withDependencies(file) }
          : error(base, status.NOT_FOUND, `file "${query.value}" not found`);
      }
      case 'fileContainingSymbol': {
        const file = this.symbols.get(query.value.replace(/^\./, ''));
        return file
          ? { ...base, ...this.withDependencies(file) }
          : error(base, status.NOT_FOUND, `symbol "${query.value}" not found`);
      }
      case 'fileContainingExtension':
      case 'allExtensionNumbersOfType':
        return error(base, status.UNIMPLEMENTED, 'extensions are not reflected: no served contract declares one');
      case undefined:
        return error(
          base,
          status.INVALID_ARGUMENT,
          'the request sets none of file_by_filename, file_containing_symbol, file_containing_extension, all_extension_numbers_of_type, list_services',
        );
    }
  }

  private async *answerEach(requests: AsyncIterable<v1.ServerReflectionRequest>): AsyncGenerator<Response> {
    for await (const request of requests) yield this.answer(request);
  }

  private async *answerEachV1alpha(
    requests: AsyncIterable<v1alpha.ServerReflectionRequest>,
  ): AsyncGenerator<v1alpha.ServerReflectionResponse> {
    for await (const request of requests) {
      const answer = this.answer(
        fromBinary(v1.ServerReflectionRequestSchema, toBinary(v1alpha.ServerReflectionRequestSchema, request)),
      );
      yield fromBinary(
        v1alpha.ServerReflectionResponseSchema,
        toBinary(v1.ServerReflectionResponseSchema, create(v1.ServerReflectionResponseSchema, answer)),
      );
    }
  }

  /** The file first, then every file it imports, transitively, each once. */
  private withDependencies(file: DescFile): Pick<Response, 'messageResponse'> {
    const order: DescFile[] = [];
    const visit = (f: DescFile) => {
      if (order.includes(f)) return;
      order.push(f);
      f.dependencies.forEach(visit);
    };
    visit(file);
    return {
      messageResponse: {
        case: 'fileDescriptorResponse',
        value: { fileDescriptorProto: order.map((f) => this.encode(f)) },
      },
    };
  }

  private encode(file: DescFile): Uint8Array {
    let bytes = this.encoded.get(file);
    if (bytes === undefined) {
      bytes = toBinary(FileDescriptorProtoSchema, file.proto);
      this.encoded.set(file, bytes);
    }
    return bytes;
  }

  private addFile(file: DescFile): void {
    if (this.files.has(file.proto.name)) return;
    this.files.set(file.proto.name, file);
    for (const type of nestedTypes(file)) {
      this.symbols.set(type.typeName, file);
      switch (type.kind) {
        case 'service':
          for (const method of type.methods) this.symbols.set(`${type.typeName}.${method.name}`, file);
          break;
        case 'message':
          for (const field of type.fields) this.symbols.set(`${type.typeName}.${field.name}`, file);
          break;
        case 'enum': {
          // Enum values are scoped like their enum, not inside it: `pkg.Enum` has `pkg.VALUE`.
          const scope = type.typeName.slice(0, type.typeName.length - type.name.length);
          for (const value of type.values) this.symbols.set(`${scope}${value.name}`, file);
          break;
        }
        case 'extension':
          break;
      }
    }
    file.dependencies.forEach((dependency) => this.addFile(dependency));
  }
}

function error(base: Pick<Response, 'validHost' | 'originalRequest'>, code: status, message: string): Response {
  return { ...base, messageResponse: { case: 'errorResponse', value: { errorCode: code, errorMessage: message } } };
}
