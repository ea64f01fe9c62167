import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseDocument } from 'yaml';
import {
  formatDurationMs,
  isCallAuthorized,
  MeshPolicyError,
  parseDurationMs,
  parseMeshPolicy,
  spiffeId,
} from './mesh-policy';

const SHIPPED = readFileSync(join(__dirname, '..', '..', '..', 'envoy', 'mesh.yaml'), 'utf8');

type Change = [path: (string | number)[], value: unknown];

/** The shipped policy with values set at paths (a path ending in 'push' adds to the list before it; undefined removes). */
function changed(...changes: Change[]): string {
  const doc = parseDocument(SHIPPED);
  for (const [path, value] of changes) {
    if (path.at(-1) === 'push') doc.addIn(path.slice(0, -1), doc.createNode(value));
    else if (value === undefined) doc.deleteIn(path);
    else doc.setIn(path, doc.createNode(value));
  }
  return doc.toString();
}

function problemsOf(text: string): readonly string[] {
  try {
    parseMeshPolicy(text, 'test.yaml');
  } catch (error) {
    if (error instanceof MeshPolicyError) return error.problems;
    throw error;
  }
  throw new Error('the policy was accepted');
}

describe('parseMeshPolicy', () => {
  it('accepts the shipped envoy/mesh.yaml and resolves every edge over the defaults', () => {
    const sut = parseMeshPolicy(SHIPPED);

    const edges = sut.edges.map((e) => `${e.from}->${e.to}`);
    expect(edges).toEqual([
      'gateway->router',
      'router->cache',
      'router->batcher',
      'batcher->worker',
      'gateway->registry',
      'router->registry',
      'cache->registry',
      'batcher->registry',
      'worker->registry',
    ]);
    const gatewayRouter = sut.edges[0]!;
    expect(gatewayRouter.loadBalancing).toEqual({ policy: 'least_request', choiceCount: 2 });
    expect(gatewayRouter.retry).toEqual({
      on: ['unavailable'],
      attempts: 3,
      backoff: { base: 25, max: 250 },
      budget: { percent: 20, minConcurrency: 3 },
    });
    expect(gatewayRouter.timeoutMs).toBe(60_000);
    const routerCache = sut.edges[1]!;
    expect(routerCache.timeoutMs).toBe(0); // lookups travel on a stream; the router times each itself
    expect(routerCache.retry.attempts).toBe(1);
    expect(routerCache.retry.backoff).toEqual({ base: 25, max: 250 }); // the rest of the retry from the defaults
    expect(sut.edges.find((e) => e.to === 'registry')!.timeoutMs).toBe(0);
    expect(sut.services.router.subsets).toEqual({ stable: { track: 'stable' }, next: { track: 'next' } });
  });

  it('reads the identity, mTLS and the authorization of every service', () => {
    const sut = parseMeshPolicy(SHIPPED);

    expect(sut.mtls).toBe(true);
    expect(sut.identity).toEqual({ trustDomain: 'infermesh.local', certificateDir: '/var/run/infermesh/identity' });
    expect(sut.sidecar.configDir).toBe('/etc/envoy');
    expect(spiffeId(sut, 'router')).toBe('spiffe://infermesh.local/router');
    expect(sut.authorization.router).toEqual([
      { from: ['gateway'], methods: ['/infermesh.router.v1.RouterService/*'] },
    ]);
    expect(sut.authorization.gateway[0]!.from).toEqual(['anyone']);
    // Who calls what, as the services' code does.
    const calls: [string, string, string, boolean][] = [
      ['gateway', 'router', '/infermesh.router.v1.RouterService/Infer', true],
      ['router', 'cache', '/infermesh.cache.v1.CacheService/Store', true],
      ['router', 'batcher', '/infermesh.batcher.v1.BatcherService/Infer', true],
      ['batcher', 'worker', '/infermesh.worker.v1.WorkerService/Infer', true],
      ['batcher', 'worker', '/infermesh.worker.v1.WorkerService/LoadModel', false],
      ['router', 'worker', '/infermesh.worker.v1.WorkerService/Infer', false],
      ['gateway', 'registry', '/infermesh.registry.v1.RegistryService/DeleteModel', true],
      ['worker', 'registry', '/infermesh.registry.v1.RegistryService/DeleteModel', false],
      ['cache', 'registry', '/infermesh.mesh.v1.InstanceService/Announce', true],
      ['cache', 'registry', '/infermesh.registry.v1.RegistryService/ListModels', false],
      ['worker', 'cache', '/grpc.health.v1.Health/Check', true],
    ];
    for (const [caller, callee, path, allowed] of calls) {
      expect([caller, callee, path, isCallAuthorized(sut, caller as never, callee as never, path)]).toEqual([
        caller,
        callee,
        path,
        allowed,
      ]);
    }
    expect(isCallAuthorized(sut, undefined, 'gateway', '/inference.GRPCInferenceService/ModelInfer')).toBe(true);
    expect(isCallAuthorized(sut, undefined, 'router', '/infermesh.router.v1.RouterService/Infer')).toBe(false);
  });

  it('defaults mtls to true, the identity and the sidecar config folder when the policy leaves them out', () => {
    const sut = parseMeshPolicy(
      changed([['mtls'], undefined], [['identity'], undefined], [['sidecar', 'configDir'], undefined]),
    );

    expect(sut.mtls).toBe(true);
    expect(sut.identity).toEqual({ trustDomain: 'infermesh.local', certificateDir: '/var/run/infermesh/identity' });
    expect(sut.sidecar.configDir).toBe('/etc/envoy');
  });

  it.each<[string, Change, string]>([
    [
      'a split to a subset the service does not have',
      [
        ['edges', 0, 'split'],
        [
          { subset: 'stable', weight: 90 },
          { subset: 'canary', weight: 10 },
        ],
      ],
      'edges[0].split[1].subset: router has no subset "canary" (known: stable, next)',
    ],
    [
      'weights that add up to 0',
      [['edges', 2, 'split'], [{ subset: 'stable', weight: 0 }]],
      'edges[2].split: the weights add up to 0, so no request could be sent',
    ],
    ['a negative timeout', [['defaults', 'timeout'], '-5s'], 'defaults.timeout: must be zero or more (got "-5s")'],
    [
      'a duration without its unit',
      [['edges', 1, 'timeout'], 250],
      'edges[1].timeout: expected a duration with its unit, such as 250ms, 10s or 2m (got 250)',
    ],
    ['an unknown field', [['edges', 1, 'retyr'], { attempts: 2 }], 'edges[1]: Unrecognized key: "retyr"'],
    ['an unknown service', [['edges', 1, 'to'], 'cahce'], 'edges[1].to: Invalid option: expected one of'],
    [
      'an edge declared twice',
      [['edges', 'push'], { from: 'router', to: 'cache' }],
      'edges[5]: the edge router -> cache is declared more than once',
    ],
    ['a service as its own upstream', [['edges', 1, 'from'], 'cache'], 'edges[1]: cache cannot be its own upstream'],
    [
      'two services on one port',
      [['services', 'cache', 'port'], 50052],
      "services.router.port: 50052 is also services.cache's port",
    ],
    [
      'a sidecar port that is a service port',
      [['sidecar', 'statsPort'], 50051],
      "sidecar.statsPort: 50051 is also services.registry's port",
    ],
    [
      'a retry back-off whose base is above its max',
      [['defaults', 'retry', 'backoff'], { base: '1s', max: '100ms' }],
      'edges[0].retry.backoff: base is longer than max',
    ],
    [
      'more than 5 attempts',
      [['defaults', 'retry', 'attempts'], 6],
      'defaults.retry.attempts: Too big: expected number to be <=5',
    ],
    [
      'a per-try timeout above the timeout',
      [['edges', 0, 'retry', 'perTryTimeout'], '2m'],
      "edges[0].retry.perTryTimeout: longer than the edge's timeout (60000 ms)",
    ],
    [
      'an ejection share above 100 %',
      [['defaults', 'outlierDetection', 'maxEjectionPercent'], 101],
      'defaults.outlierDetection.maxEjectionPercent: Too big',
    ],
    [
      'a fault status that is not a gRPC code',
      [['edges', 2, 'fault'], { abort: { percent: 10, grpcStatus: 'UNAVAILIBLE' } }],
      'edges[2].fault.abort.grpcStatus: Invalid option',
    ],
    [
      'authorization of a service the mesh does not have',
      [['authorization', 'cahce'], [{ from: 'router', methods: ['/infermesh.cache.v1.CacheService/*'] }]],
      'authorization.cahce: not a service of the mesh (registry, cache, worker, batcher, router, gateway)',
    ],
    [
      'a caller the mesh does not have',
      [['authorization', 'router', 0, 'from'], 'gatway'],
      'authorization.router[0].from: "gatway" is not a service of the mesh (registry, cache, worker, batcher, router, gateway), nor operator or anyone',
    ],
    [
      'a caller the mesh does not have, in a list',
      [
        ['authorization', 'cache', 0, 'from'],
        ['router', 'routr'],
      ],
      'authorization.cache[0].from[1]: "routr" is not a service of the mesh',
    ],
    [
      'a caller named twice',
      [
        ['authorization', 'cache', 0, 'from'],
        ['router', 'router'],
      ],
      'authorization.cache[0].from: router is named more than once',
    ],
    [
      'a method without its leading slash',
      [['authorization', 'router', 0, 'methods'], ['infermesh.router.v1.RouterService/Infer']],
      'authorization.router[0].methods[0]: expected a method path /package.Service/Method, or /package.Service/* for all of its methods',
    ],
    [
      'a wildcard inside a method name',
      [['authorization', 'router', 0, 'methods'], ['/infermesh.router.v1.RouterService/Inf*']],
      'authorization.router[0].methods[0]: expected a method path',
    ],
    [
      'a wildcard for every service',
      [['authorization', 'router', 0, 'methods'], ['/*']],
      'authorization.router[0].methods[0]: expected a method path',
    ],
    [
      'a method named twice',
      [
        ['authorization', 'cache', 0, 'methods'],
        ['/infermesh.cache.v1.CacheService/Lookup', '/infermesh.cache.v1.CacheService/Lookup'],
      ],
      'authorization.cache[0].methods: /infermesh.cache.v1.CacheService/Lookup is named more than once',
    ],
    [
      'a rule without methods',
      [['authorization', 'router', 0, 'methods'], []],
      'authorization.router[0].methods: Too small',
    ],
    [
      'an unknown field in a rule',
      [['authorization', 'router', 0, 'method'], ['/a.B/C']],
      'authorization.router[0]: Unrecognized key: "method"',
    ],
    [
      "an edge whose caller may call none of its callee's methods",
      [['authorization', 'router'], []],
      'edges[0]: gateway calls router, but authorization.router lets gateway call none of its methods',
    ],
    ['no authorization at all', [['authorization'], undefined], 'authorization: Invalid input'],
    [
      'a trust domain that is not one',
      [['identity', 'trustDomain'], 'InferMesh.local'],
      'identity.trustDomain: expected a SPIFFE trust domain',
    ],
    [
      'a relative certificate folder',
      [['identity', 'certificateDir'], 'var/run/identity'],
      'identity.certificateDir: expected an absolute path',
    ],
    ['an unknown identity field', [['identity', 'spiffeId'], 'x'], 'identity: Unrecognized key: "spiffeId"'],
    ['mtls that is not true or false', [['mtls'], 'yes'], 'mtls: Invalid input: expected boolean'],
  ])('refuses %s, naming the field', (_what, change, expected) => {
    const problems = problemsOf(changed(change));

    expect(problems.map((p) => p.slice(0, expected.length))).toContain(expected);
  });

  it('says every problem at once, and which file it is', () => {
    let error: unknown;
    try {
      parseMeshPolicy(
        changed([['defaults', 'timeout'], '-1s'], [['edges', 0, 'split'], [{ subset: 'x', weight: 1 }]]),
        'envoy/mesh.yaml',
      );
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(MeshPolicyError);
    expect((error as Error).message).toMatch(/^envoy\/mesh\.yaml: invalid mesh policy:\n {2}- defaults\.timeout/);
  });

  it('refuses text that is not YAML, and a duplicated key', () => {
    expect(problemsOf('edges: [')[0]).toMatch(/^not valid YAML/);
    expect(problemsOf(`${SHIPPED}\nversion: 1\n`)[0]).toMatch(/^not valid YAML: .*[Mm]ap keys must be unique/);
  });
});

describe('formatDurationMs', () => {
  it('writes a duration in its largest whole unit, which parseDurationMs reads back', () => {
    const written = [3_600_000, 120_000, 1_500, 250, 0].map(formatDurationMs);
    expect(written).toEqual(['1h', '2m', '1500ms', '250ms', '0ms']);
    expect(written.map(parseDurationMs)).toEqual([3_600_000, 120_000, 1_500, 250, 0]);
  });
});

describe('parseDurationMs', () => {
  it('reads durations with their unit', () => {
    expect([
      parseDurationMs('250ms'),
      parseDurationMs('1.5s'),
      parseDurationMs('2m'),
      parseDurationMs('1h'),
      parseDurationMs('0s'),
    ]).toEqual([250, 1500, 120_000, 3_600_000, 0]);
    expect([parseDurationMs('10'), parseDurationMs('s'), parseDurationMs('1d'), parseDurationMs('')]).toEqual([
      undefined,
      undefined,
      undefined,
      undefined,
    ]);
  });
});
