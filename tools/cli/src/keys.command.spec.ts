import {
  type CreateApiKeyRequest,
  type RevokeApiKeyRequest,
  Scope,
} from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';
import { KEYS_GROUP } from './keys.command';
import { runCapturing } from './testing/cli-runner';
import type { FakeApiKeys } from './testing/fake-api-keys';
import { type FakeGateway, startFakeGateway } from './testing/fake-gateway';

const API_KEY = 'admin-key-0123456789abcdef';
const SECRET = `im_0123456789a0_${'s'.repeat(43)}`;

describe(`infermesh ${KEYS_GROUP.name}`, () => {
  let running: FakeGateway;
  let keys: FakeApiKeys;

  beforeEach(async () => {
    running = await startFakeGateway(API_KEY);
    keys = running.apiKeys;
  });

  afterEach(async () => {
    await running.stop();
  });

  const sut = (argv: string[], apiKey = API_KEY) =>
    runCapturing(['keys', ...argv], { INFERMESH_GATEWAY: running.address, INFERMESH_API_KEY: apiKey });
  const created = () => keys.requests<CreateApiKeyRequest>('createApiKey');

  describe('create', () => {
    it('creates a key with what the flags give and prints the key alone on stdout, saying it is shown once', async () => {
      const run = await sut([
        'create',
        '--name',
        'checkout',
        '--scope',
        'infer',
        '--scope',
        'admin',
        '--tenant',
        'team-a',
        '--model',
        'mlp',
        '--model',
        'tiny',
        '--rps',
        '5',
        '--burst',
        '10',
        '--model-rps',
        '0.5',
        '--model-burst',
        '2',
      ]);

      expect(run.code).toBe(0);
      expect(run.stdout).toBe(`${SECRET}\n`);
      expect(run.stderr).toBe(
        'Created API key apiKeys/0123456789a0 (checkout): scopes infer+admin, tenant team-a, models mlp, tiny, limits 5/s (burst 10), 0.5/s per model (burst 2).\n' +
          'The key is shown this once, below: store it now (the gateway keeps only a hash of it). Clients send it as "Authorization: Bearer <key>".\n',
      );
      expect(created()).toMatchObject([
        {
          key: {
            displayName: 'checkout',
            scopes: [Scope.INFER, Scope.ADMIN],
            tenant: 'team-a',
            models: ['mlp', 'tiny'],
            rateLimit: { requestsPerSecond: 5, burst: 10, perModelRequestsPerSecond: 0.5, perModelBurst: 2 },
          },
        },
      ]);
      expect(keys.calls.map((c) => c.authorization)).toEqual([`Bearer ${API_KEY}`]);
    });

    it("creates an infer key with the gateway's default limits when no flag says otherwise", async () => {
      const run = await sut(['create']);

      expect(run.code).toBe(0);
      expect(run.stderr).toContain('scopes infer, tenant key:0123456789a0, models all, limits gateway defaults');
      expect(created()).toMatchObject([{ key: { displayName: '', scopes: [Scope.INFER], tenant: '', models: [] } }]);
      expect(created()[0]!.key!.rateLimit).toBeUndefined();
    });

    it('prints the CreateApiKeyResponse with --json, and no note', async () => {
      const run = await sut(['create', '--scope', 'admin', '--json']);

      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(JSON.parse(run.stdout)).toEqual({
        key: { name: 'apiKeys/0123456789a0', scopes: ['SCOPE_ADMIN'], createTime: expect.any(String) },
        secret: SECRET,
      });
    });

    it.each([
      [['--scope', 'write'], '--scope must be infer or admin, got "write"'],
      [['--rps', '-1'], '--rps must be a number of requests per second from 0 up, got "-1"'],
      [['--model-rps', 'fast'], '--model-rps must be a number of requests per second from 0 up, got "fast"'],
      [['--rps', '1', '--burst', '1.5'], '--burst must be an integer of at least 0, got "1.5"'],
      [['--burst', '3'], '--burst needs --rps: a burst without a rate limits nothing'],
      [['--model-burst', '3'], '--model-burst needs --model-rps: a burst without a rate limits nothing'],
    ])('refuses %j with exit 2, naming the flag, and asks the gateway nothing', async (flags, message) => {
      const run = await sut(['create', ...flags]);

      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(
        new RegExp(`^infermesh: ${message.replace(/[()[\].+*?^$|\\]/g, '\\$&')}\n\nUsage: infermesh keys create`),
      );
      expect(keys.calls).toEqual([]);
    });

    it('exits 1 with the reason when the gateway refuses the key', async () => {
      const denied = await sut(['create'], 'infer-only-key-0123456789');

      expect(denied).toEqual({
        code: 1,
        stdout: '',
        stderr:
          'infermesh: this API key lacks the admin scope (PERMISSION_DENIED)\nThe admin API needs a key with the admin scope.\n',
      });
    });
  });

  describe('list', () => {
    it('lists every key with its settings and never a secret', async () => {
      keys.seed({
        name: 'apiKeys/00000000000a',
        displayName: 'checkout',
        scopes: [Scope.INFER],
        tenant: 'team-a',
        models: ['mlp', 'tiny'],
        rateLimit: { requestsPerSecond: 5, perModelRequestsPerSecond: 1, perModelBurst: 3 },
        createTime: { seconds: 1_700_000_000n },
      });
      keys.seed({
        name: 'apiKeys/00000000000b',
        scopes: [Scope.INFER, Scope.ADMIN],
        createTime: { seconds: 1_700_000_100n },
        revokeTime: { seconds: 1_700_000_200n },
      });

      const run = await sut(['list']);

      expect(run).toEqual({
        code: 0,
        stderr: '',
        stdout: [
          'ID            NAME      SCOPES       TENANT                      MODELS     LIMITS                                  CREATED                   REVOKED',
          '00000000000a  checkout  infer        team-a                      mlp, tiny  5/s (burst 5), 1/s per model (burst 3)  2023-11-14T22:13:20.000Z  -',
          '00000000000b  -         infer+admin  key:00000000000b (default)  all        gateway defaults                        2023-11-14T22:15:00.000Z  2023-11-14T22:16:40.000Z',
          '',
        ].join('\n'),
      });
    });

    it('says when there is no key, and prints the ListApiKeysResponse with --json', async () => {
      expect(await sut(['list'])).toEqual({
        code: 0,
        stderr: '',
        stdout: 'No API keys stored. Create one with `infermesh keys create`.\n',
      });
      keys.seed({ name: 'apiKeys/00000000000a', scopes: [Scope.ADMIN] });

      const json = await sut(['list', '--json']);

      expect(JSON.parse(json.stdout)).toEqual({ keys: [{ name: 'apiKeys/00000000000a', scopes: ['SCOPE_ADMIN'] }] });
    });
  });

  describe('revoke', () => {
    it('revokes a key named by its id or its resource name', async () => {
      keys.seed({ name: 'apiKeys/00000000000a', displayName: 'checkout', scopes: [Scope.INFER] });

      const byId = await sut(['revoke', '00000000000a']);
      const byName = await sut(['revoke', 'apiKeys/00000000000a', '--json']);

      expect(byId).toEqual({
        code: 0,
        stderr: '',
        stdout:
          'Revoked API key apiKeys/00000000000a (checkout): scopes infer, tenant key:00000000000a, models all, limits gateway defaults.\n' +
          'It is refused from now on, within a second on every gateway replica.\n',
      });
      expect(JSON.parse(byName.stdout)).toMatchObject({ name: 'apiKeys/00000000000a', revokeTime: expect.any(String) });
      expect(keys.requests<RevokeApiKeyRequest>('revokeApiKey').map((r) => r.name)).toEqual([
        'apiKeys/00000000000a',
        'apiKeys/00000000000a',
      ]);
    });

    it('exits 1 naming an unknown key, and 2 without one', async () => {
      expect(await sut(['revoke', '0123456789ab'])).toEqual({
        code: 1,
        stdout: '',
        stderr: 'infermesh: API key apiKeys/0123456789ab does not exist (NOT_FOUND)\n',
      });
      const missing = await sut(['revoke']);
      expect(missing.code).toBe(2);
      expect(missing.stderr).toMatch(/^infermesh: missing <id\|apiKeys\/id>\n/);
    });
  });

  it('lists its commands and their flags in the help', async () => {
    const group = await runCapturing(['keys', '--help'], {});
    const create = await runCapturing(['help', 'keys', 'create'], {});

    for (const name of ['create', 'list', 'revoke']) expect(group.stdout).toMatch(new RegExp(`\\n  ${name} +\\S`));
    for (const flag of [
      '--name <display name>',
      '--scope infer|admin',
      '(repeatable)',
      '--tenant <tenant>',
      '--model <model>',
      '--rps <n>',
      '--burst <n>',
      '--model-rps <n>',
      '--model-burst <n>',
      '--api-key <key>',
      '--json',
    ]) {
      expect(create.stdout).toContain(flag);
    }
    expect(create.stdout).toContain('shown this once');
  });
});
