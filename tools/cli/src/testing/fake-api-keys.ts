import { clone, create } from '@bufbuild/protobuf';
import { timestampNow } from '@bufbuild/protobuf/wkt';
import { type CallContext, type ServiceImpl, Errors } from '@infermesh/grpc';
import { type ApiKey, ApiKeySchema, type ApiKeyService } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import type { RecordedCall } from '@infermesh/testing';

type Impl = ServiceImpl<typeof ApiKeyService>;

/**
 * The gateway's ApiKeyService as the CLI's specs see it (the gateway is outside the CLI): keys in
 * memory, each call recorded with its authorization header. Only callers presenting `Bearer <apiKey>`
 * are served; a caller presenting `Bearer <inferOnlyKey>` is refused as a key without the admin scope.
 */
export class FakeApiKeys implements Impl {
  readonly calls: RecordedCall[] = [];
  private readonly keys = new Map<string, ApiKey>();
  private next = 0x0123456789a0;

  constructor(
    private readonly apiKey: string,
    private readonly inferOnlyKey = 'infer-only-key-0123456789',
  ) {}

  /** The requests of one method, in order. */
  requests<T>(method: keyof Impl): T[] {
    return this.calls.filter((c) => c.method === method).map((c) => c.request as T);
  }

  createApiKey: Impl['createApiKey'] = async (request, ctx) => {
    this.admit('createApiKey', request, ctx);
    if (request.key === undefined || request.key.scopes.length === 0) {
      throw Errors.invalidRequest('key.scopes must name at least one scope: SCOPE_INFER, SCOPE_ADMIN');
    }
    const id = (this.next++).toString(16).padStart(12, '0');
    const key = clone(ApiKeySchema, request.key);
    key.name = `apiKeys/${id}`;
    key.createTime = timestampNow();
    this.keys.set(key.name, key);
    return { key, secret: `im_${id}_${'s'.repeat(43)}` };
  };

  listApiKeys: Impl['listApiKeys'] = async (request, ctx) => {
    this.admit('listApiKeys', request, ctx);
    return { keys: [...this.keys.values()] };
  };

  revokeApiKey: Impl['revokeApiKey'] = async (request, ctx) => {
    this.admit('revokeApiKey', request, ctx);
    const key = this.keys.get(request.name);
    if (key === undefined) throw Errors.apiKeyNotFound(`API key ${request.name} does not exist`);
    key.revokeTime ??= timestampNow();
    return { key };
  };

  /** Adds a key as the gateway would have stored it. */
  seed(init: Parameters<typeof create<typeof ApiKeySchema>>[1]): ApiKey {
    const key = create(ApiKeySchema, init);
    this.keys.set(key.name, key);
    return key;
  }

  private admit(method: string, request: unknown, ctx: CallContext): void {
    const authorization = ctx.metadata['authorization'];
    this.calls.push({ method, request, authorization });
    if (authorization === `Bearer ${this.inferOnlyKey}`) {
      throw Errors.permissionDenied('this API key lacks the admin scope');
    }
    if (authorization !== `Bearer ${this.apiKey}`) throw Errors.unauthenticated('invalid API key');
  }
}
