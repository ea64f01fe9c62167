import type { MessageInitShape } from '@bufbuild/protobuf';
import {
  ApiKeySchema,
  CreateApiKeyResponseSchema,
  ListApiKeysResponseSchema,
  type RateLimitSchema,
  Scope,
} from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { command, type GroupSpec, parseInteger, parseRate } from './args';
import { UsageError } from './cli-errors';
import type { CommandContext, CommandHandler } from './command-context';
import { GATEWAY_FLAGS } from './gateway-flags';
import { formatApiKey, formatApiKeyList } from './output/format';

const SCOPES: ReadonlyMap<string, Scope> = new Map([
  ['infer', Scope.INFER],
  ['admin', Scope.ADMIN],
]);

function parseScope(value: string): Scope {
  const scope = SCOPES.get(value.toLowerCase());
  if (scope === undefined) throw new UsageError(`--scope must be infer or admin, got "${value}"`);
  return scope;
}

/** The limits the flags give; undefined when none is given (the gateway's defaults apply). */
function rateLimitOf(ctx: CommandContext): MessageInitShape<typeof RateLimitSchema> | undefined {
  const { args } = ctx;
  if (!['rps', 'burst', 'model-rps', 'model-burst'].some((flag) => args.has(flag))) return undefined;
  const rate = (flag: string) => {
    const value = args.value(flag);
    return value === undefined ? 0 : parseRate(value, `--${flag}`);
  };
  const burst = (flag: string, rateFlag: string) => {
    const value = args.value(flag);
    if (value === undefined) return 0;
    if (!args.has(rateFlag))
      throw new UsageError(`--${flag} needs --${rateFlag}: a burst without a rate limits nothing`);
    return parseInteger(value, `--${flag}`, 0);
  };
  return {
    requestsPerSecond: rate('rps'),
    burst: burst('burst', 'rps'),
    perModelRequestsPerSecond: rate('model-rps'),
    perModelBurst: burst('model-burst', 'model-rps'),
  };
}

async function create(ctx: CommandContext): Promise<void> {
  const { args } = ctx;
  const scopes = args.list('scope').map(parseScope);
  const rateLimit = rateLimitOf(ctx);
  const key: MessageInitShape<typeof ApiKeySchema> = {
    displayName: args.value('name') ?? '',
    scopes: scopes.length === 0 ? [Scope.INFER] : scopes,
    tenant: args.value('tenant') ?? '',
    models: [...args.list('model')],
    ...(rateLimit !== undefined && { rateLimit }),
  };
  const session = ctx.gateway();
  const response = await session.apiKeys.createApiKey({ key }, session.call());
  if (response.key === undefined) throw new Error('the gateway returned no key');
  ctx.note(
    `Created API key ${formatApiKey(response.key)}.\n` +
      'The key is shown this once, below: store it now (the gateway keeps only a hash of it). ' +
      'Clients send it as "Authorization: Bearer <key>".\n',
  );
  ctx.result(CreateApiKeyResponseSchema, response, () => `${response.secret}\n`);
}

async function list(ctx: CommandContext): Promise<void> {
  const session = ctx.gateway();
  const response = await session.apiKeys.listApiKeys({}, session.call());
  ctx.result(ListApiKeysResponseSchema, response, () => formatApiKeyList(response.keys));
}

async function revoke(ctx: CommandContext): Promise<void> {
  const given = ctx.args.positionals[0]!;
  const name = given.startsWith('apiKeys/') ? given : `apiKeys/${given}`;
  const session = ctx.gateway();
  const { key } = await session.apiKeys.revokeApiKey({ name }, session.call());
  if (key === undefined) throw new Error(`the gateway returned no key for ${name}`);
  ctx.result(
    ApiKeySchema,
    key,
    () =>
      `Revoked API key ${formatApiKey(key)}.\nIt is refused from now on, within a second on every gateway replica.\n`,
  );
}

/** `infermesh keys ...`: the gateway's stored API keys, through its admin API. */
export const KEYS_GROUP: GroupSpec<CommandHandler> = {
  kind: 'group',
  name: 'keys',
  summary: "Create, list and revoke the gateway's API keys (scopes, tenant, models, rate limits)",
  flags: GATEWAY_FLAGS,
  commands: [
    command<CommandHandler>({
      name: 'create',
      summary: 'Create an API key and print it: it is shown this once',
      details: [
        'The key (im_<id>_<secret>) goes to stdout, alone, and is never shown again: the gateway keeps',
        'only a salted hash of it. Without --scope the key may infer only. Rate limits apply to inference:',
        'a bucket per key (--rps, --burst) and one per key and model (--model-rps, --model-burst); a burst of',
        "0 is the rate (at least 1). Without any of them the gateway's defaults (GATEWAY_RATE_LIMIT_*) apply.",
      ].join('\n'),
      positionals: [],
      flags: [
        {
          name: 'name',
          kind: 'value',
          placeholder: '<display name>',
          description: 'A label for people, e.g. checkout-service',
        },
        {
          name: 'scope',
          kind: 'list',
          placeholder: 'infer|admin',
          description: 'What the key may do: infer (inference, model metadata) or admin (the admin API); default infer',
        },
        {
          name: 'tenant',
          kind: 'value',
          placeholder: '<tenant>',
          description: 'Whose requests these are: scopes cached results and sticky rollouts (default: the key id)',
        },
        {
          name: 'model',
          kind: 'list',
          placeholder: '<model>',
          description: 'A model the key may use (default: every model)',
        },
        {
          name: 'rps',
          kind: 'value',
          placeholder: '<n>',
          description: 'Inference requests per second over all models (0: no limit)',
        },
        {
          name: 'burst',
          kind: 'value',
          placeholder: '<n>',
          description: 'Requests admitted at once after an idle time (default: --rps)',
        },
        {
          name: 'model-rps',
          kind: 'value',
          placeholder: '<n>',
          description: 'Inference requests per second to any one model (0: no limit)',
        },
        {
          name: 'model-burst',
          kind: 'value',
          placeholder: '<n>',
          description: 'Requests to one model admitted at once (default: --model-rps)',
        },
      ],
      handler: create,
    }),
    command<CommandHandler>({
      name: 'list',
      summary: 'List the API keys: id, name, scopes, tenant, models, limits, created, revoked (never a secret)',
      positionals: [],
      flags: [],
      handler: list,
    }),
    command<CommandHandler>({
      name: 'revoke',
      summary: 'Revoke an API key: the gateway refuses it from then on',
      positionals: [{ name: '<id|apiKeys/id>' }],
      flags: [],
      handler: revoke,
    }),
  ],
};
