import { fieldPath } from '@infermesh/config';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';

/**
 * The mesh policy (`envoy/mesh.yaml`): how the services reach each other. It is the one source from
 * which every Envoy sidecar's configuration (and the control plane's xDS resources) is compiled, so
 * it is validated here once, completely, and every problem names the field it is in.
 */

/** The services of the mesh, in the order they start; the registry is also the control plane. */
export const MESH_SERVICES = ['registry', 'cache', 'worker', 'batcher', 'router', 'gateway'] as const;
export type MeshService = (typeof MESH_SERVICES)[number];

/** A policy that cannot be used: every problem, each naming its field (`edges[1].retry.attempts: ...`). */
export class MeshPolicyError extends Error {
  constructor(
    readonly source: string,
    readonly problems: readonly string[],
  ) {
    super(`${source}: invalid mesh policy:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'MeshPolicyError';
  }
}

const DURATION_UNITS_MS: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };

/** "250ms", "1.5s", "2m", "1h" in milliseconds; undefined when it is not such a duration. */
export function parseDurationMs(text: string): number | undefined {
  const match = /^(-?\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(text.trim());
  if (match === null) return undefined;
  const ms = Number(match[1]) * DURATION_UNITS_MS[match[2]!]!;
  return Number.isFinite(ms) ? ms : undefined;
}

/** What parseDurationMs reads back: the largest unit that divides it whole (60000 → "1m", 1500 → "1500ms"). */
export function formatDurationMs(ms: number): string {
  const [unit, size] = Object.entries(DURATION_UNITS_MS)
    .sort((a, b) => b[1] - a[1])
    .find(([, size]) => ms >= size && ms % size === 0) ?? ['ms', 1];
  return `${ms / size}${unit}`;
}

/** A duration written with its unit ("250ms", "10s"), in milliseconds; above 0 unless allowZero. */
const duration = (options: { allowZero?: boolean } = {}) =>
  z.union([z.string(), z.number()]).transform((value, ctx) => {
    const ms = typeof value === 'string' ? parseDurationMs(value) : undefined;
    if (ms === undefined) {
      ctx.addIssue({
        code: 'custom',
        message: `expected a duration with its unit, such as 250ms, 10s or 2m (got ${JSON.stringify(value)})`,
      });
      return z.NEVER;
    }
    if (ms < 0 || (ms === 0 && options.allowZero !== true)) {
      ctx.addIssue({
        code: 'custom',
        message: `must be ${options.allowZero === true ? 'zero or more' : 'more than zero'} (got ${JSON.stringify(value)})`,
      });
      return z.NEVER;
    }
    if (!Number.isInteger(ms)) {
      ctx.addIssue({
        code: 'custom',
        message: `must be a whole number of milliseconds (got ${JSON.stringify(value)})`,
      });
      return z.NEVER;
    }
    return ms;
  });

const percent = z.number().min(0).max(100);
const count = z.number().int().min(0);
const positiveCount = z.number().int().min(1);
const service = z.enum(MESH_SERVICES);
const name = z
  .string()
  .regex(/^[a-z][a-z0-9-]{0,30}$/, 'expected a lower-case name: letters, digits and dashes, at most 31');

/** gRPC status names a retry policy may retry on (Envoy's `retry_on` gRPC conditions). */
export const RETRIABLE_GRPC_CODES = [
  'cancelled',
  'deadline-exceeded',
  'internal',
  'resource-exhausted',
  'unavailable',
] as const;

/** gRPC status codes by name, for fault injection. */
export const GRPC_STATUS_CODES = {
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const;

const retrySchema = z
  .object({
    /** gRPC statuses that are retried. */
    on: z.array(z.enum(RETRIABLE_GRPC_CODES)),
    /** Attempts in all, the first included (gRFC A44's maxAttempts); 1: no retry. */
    attempts: positiveCount.max(5),
    /** The deadline of each attempt; unset: the call's own. */
    perTryTimeout: duration().optional(),
    /** Waits between attempts: random up to base × 2^n, at most max (full jitter). */
    backoff: z.object({ base: duration(), max: duration() }).strict(),
    /** Retries may add at most this share of the active requests, but always `minConcurrency`. */
    budget: z.object({ percent, minConcurrency: count }).strict(),
  })
  .strict();

const outlierSchema = z
  .object({
    /** Consecutive failures (any error status) that eject an endpoint. 0: off. */
    consecutiveFailures: count,
    /** Consecutive UNAVAILABLE-like failures (connect errors, resets) that eject an endpoint. 0: off. */
    consecutiveGatewayFailures: count,
    /** How often endpoints' failure rates are looked at. */
    interval: duration(),
    /** How long an ejection lasts, times the number of times the endpoint was ejected. */
    baseEjectionTime: duration(),
    /** At most this share of the endpoints are ejected at once. */
    maxEjectionPercent: percent,
    /** Eject endpoints whose failure share over an interval reaches the threshold. */
    failurePercentage: z
      .object({ threshold: percent, minimumHosts: positiveCount, requestVolume: positiveCount })
      .strict()
      .optional(),
    /** Eject endpoints whose success rate is `stdevFactor`/1000 standard deviations under the mean. */
    successRate: z
      .object({ stdevFactor: positiveCount, minimumHosts: positiveCount, requestVolume: positiveCount })
      .strict()
      .optional(),
  })
  .strict();

const circuitBreakerSchema = z
  .object({
    maxConnections: positiveCount,
    maxRequests: positiveCount,
    maxPendingRequests: positiveCount,
    maxRetries: count,
  })
  .strict();

const loadBalancingSchema = z.discriminatedUnion('policy', [
  /** The endpoint with the fewest active requests among `choiceCount` picked at random (P2C for 2). */
  z.object({ policy: z.literal('least_request'), choiceCount: z.number().int().min(2).max(10) }).strict(),
  z.object({ policy: z.literal('round_robin') }).strict(),
  /**
   * Consistent hashing on a request header, so one key keeps its endpoint (cache locality). The ring
   * keeps its default size (1024 and up): grpc-js-xds refuses a ring size set in the policy.
   */
  z
    .object({
      policy: z.literal('ring_hash'),
      hashHeader: z.string().regex(/^[a-z0-9-]+$/, 'expected a lower-case header name'),
    })
    .strict(),
]);

const faultSchema = z
  .object({
    /** A share of calls answered at once with this gRPC status. */
    abort: z
      .object({ percent, grpcStatus: z.enum(Object.keys(GRPC_STATUS_CODES) as [keyof typeof GRPC_STATUS_CODES]) })
      .strict()
      .optional(),
    /** A share of calls delayed by this long. */
    delay: z.object({ percent, fixed: duration() }).strict().optional(),
  })
  .strict();

/**
 * Faults injected where calls arrive: at the service's instances (or those of one subset), whoever
 * calls. Its callers' retries and outlier detection see them as they would a failing instance.
 */
const inboundFaultSchema = faultSchema.extend({ subset: name.optional() }).strict();

/** The method paths of gRPC health checks: anyone may call them, whatever `authorization` says. */
export const HEALTH_METHODS = '/grpc.health.v1.Health/*';

/** A caller in `authorization`: a service of the mesh (by its SPIFFE ID), or anyone (with or without an identity). */
export const ANYONE = 'anyone';
/**
 * The operator's identity (`spiffe://<trustDomain>/operator`): whoever holds the CA on the machine,
 * `infermesh up` registering the demo models, say; on Kubernetes, a job given that certificate.
 */
export const OPERATOR = 'operator';
export type MeshCaller = MeshService | typeof OPERATOR | typeof ANYONE;

/** `/package.Service/Method`, or `/package.Service/*` for every method of the service. */
export const METHOD_PATTERN = /^\/(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*\/(?:\*|[A-Za-z_][A-Za-z0-9_]*)$/;

const absolutePath = z.string().regex(/^\/\S*$/, 'expected an absolute path');

/** Who the instances are: SPIFFE IDs `spiffe://<trustDomain>/<service>`, and where each finds its certificate. */
const identitySchema = z
  .object({
    trustDomain: z
      .string()
      .max(255)
      .regex(
        /^[a-z0-9.-]+$/,
        'expected a SPIFFE trust domain: lower-case letters, digits, dots and dashes, such as infermesh.local',
      )
      .default('infermesh.local'),
    /** cert.pem (its SPIFFE ID as a URI SAN), key.pem and ca.pem (the trust bundle), rotated in place. */
    certificateDir: absolutePath.default('/var/run/infermesh/identity'),
  })
  .strict();

/** Which callers may call which methods of a service. */
const authorizationRuleSchema = z
  .object({
    /** Services (checked after parsing, to say which names are known), or `anyone`. */
    from: z.union([z.string(), z.array(z.string()).min(1)]),
    methods: z
      .array(
        z
          .string()
          .regex(
            METHOD_PATTERN,
            'expected a method path /package.Service/Method, or /package.Service/* for all of its methods',
          ),
      )
      .min(1),
  })
  .strict();

/** Settings every edge has, from `defaults` or its own. */
const edgeSettingsShape = {
  /** The longest a call on the edge may take, whatever deadline it carries; 0s: no limit (streams). */
  timeout: duration({ allowZero: true }),
  connectTimeout: duration(),
  retry: retrySchema,
  outlierDetection: outlierSchema,
  circuitBreakers: circuitBreakerSchema,
  loadBalancing: loadBalancingSchema,
};

const edgeSchema = z
  .object({
    from: z.union([service, z.array(service).min(1)]),
    to: service,
    timeout: edgeSettingsShape.timeout.optional(),
    connectTimeout: edgeSettingsShape.connectTimeout.optional(),
    retry: retrySchema.partial().strict().optional(),
    outlierDetection: outlierSchema.partial().strict().optional(),
    circuitBreakers: circuitBreakerSchema.partial().strict().optional(),
    loadBalancing: loadBalancingSchema.optional(),
    /** Requests whose header matches go to one subset, before the split. */
    routes: z
      .array(
        z
          .object({
            match: z
              .object({
                header: z.string().regex(/^[a-z0-9-]+$/, 'expected a lower-case header name'),
                exact: z.string().min(1),
              })
              .strict(),
            subset: name,
          })
          .strict(),
      )
      .optional(),
    /** The rest is split between subsets by weight. */
    split: z
      .array(z.object({ subset: name, weight: count }).strict())
      .min(1)
      .optional(),
    /** A share of the requests is also sent to a subset, whose answers are dropped. */
    mirror: z.object({ subset: name, percent }).strict().optional(),
    fault: faultSchema.optional(),
  })
  .strict();

const policySchema = z
  .object({
    version: z.literal(1),
    /** Where the services run on Kubernetes: the Services' DNS names are `<service>.<namespace>.svc.<clusterDomain>`. */
    kubernetes: z.object({ namespace: name, clusterDomain: z.string().min(1) }).strict(),
    /** The ports every sidecar uses inside its pod. */
    sidecar: z
      .object({
        inboundPort: z.number().int().min(1).max(65535),
        adminPort: z.number().int().min(1).max(65535),
        statsPort: z.number().int().min(1).max(65535),
        /** Where the sidecar finds the files compiled for it (its bootstrap, the SDS files); default /etc/envoy. */
        configDir: absolutePath.default('/etc/envoy'),
      })
      .strict(),
    /** Each service's own gRPC port, and its subsets: named groups of its instances, by pod label. */
    services: z
      .object(
        Object.fromEntries(
          MESH_SERVICES.map((s) => [
            s,
            z
              .object({
                port: z.number().int().min(1).max(65535),
                subsets: z.record(name, z.record(z.string().min(1), z.string().min(1))).optional(),
                inboundFault: inboundFaultSchema.optional(),
              })
              .strict(),
          ]),
        ) as Record<
          MeshService,
          z.ZodObject<{
            port: z.ZodNumber;
            subsets: z.ZodOptional<z.ZodRecord<typeof name, z.ZodRecord<z.ZodString, z.ZodString>>>;
            inboundFault: z.ZodOptional<typeof inboundFaultSchema>;
          }>
        >,
      )
      .strict(),
    defaults: z.object(edgeSettingsShape).strict(),
    edges: z.array(edgeSchema).min(1),
    /** Mutual TLS between every service (the default); false: plaintext, and no authorization either. */
    mtls: z.boolean().default(true),
    identity: identitySchema.default({ trustDomain: 'infermesh.local', certificateDir: '/var/run/infermesh/identity' }),
    /** Per callee service, who may call which of its methods; a service with no entry: nobody (but health checks). */
    authorization: z.record(z.string(), z.array(authorizationRuleSchema)),
    /** Where sidecars send traces (an OTLP/gRPC collector `host:port`); unset: no tracing. */
    tracing: z
      .object({ collector: z.string().regex(/^[^\s:]+:\d{1,5}$/, 'expected host:port') })
      .strict()
      .optional(),
  })
  .strict();

type ParsedPolicy = z.infer<typeof policySchema>;
export type RetryPolicy = z.infer<typeof retrySchema>;
export type OutlierDetection = z.infer<typeof outlierSchema>;
export type CircuitBreakers = z.infer<typeof circuitBreakerSchema>;
export type LoadBalancing = z.infer<typeof loadBalancingSchema>;
export type FaultInjection = z.infer<typeof faultSchema>;

/** One caller → callee edge with every setting resolved (its own over the defaults). */
export interface MeshEdge {
  from: MeshService;
  to: MeshService;
  timeoutMs: number;
  connectTimeoutMs: number;
  retry: RetryPolicy;
  outlierDetection: OutlierDetection;
  circuitBreakers: CircuitBreakers;
  loadBalancing: LoadBalancing;
  routes: { header: string; exact: string; subset: string }[];
  /** Subsets and weights; empty: the whole service. */
  split: { subset: string; weight: number }[];
  mirror: { subset: string; percent: number } | undefined;
  fault: FaultInjection | undefined;
}

export type InboundFault = z.infer<typeof inboundFaultSchema>;

/** One rule of a callee's authorization: these callers may call these methods (patterns as METHOD_PATTERN). */
export interface AuthorizationRule {
  from: MeshCaller[];
  methods: string[];
}

/** The identity every instance of the mesh has. */
export interface MeshIdentity {
  /** SPIFFE IDs are `spiffe://<trustDomain>/<service>`. */
  trustDomain: string;
  /** The instance's cert.pem, key.pem and ca.pem (on Kubernetes, cert-manager's CSI driver mounts them here). */
  certificateDir: string;
}

export interface MeshPolicy {
  kubernetes: ParsedPolicy['kubernetes'];
  sidecar: ParsedPolicy['sidecar'];
  services: Record<
    MeshService,
    { port: number; subsets: Record<string, Record<string, string>>; inboundFault: InboundFault | undefined }
  >;
  edges: MeshEdge[];
  tracing: ParsedPolicy['tracing'];
  /** Mutual TLS between the services, and the authorization enforced with it. */
  mtls: boolean;
  identity: MeshIdentity;
  /** Per callee, its rules (empty: nobody may call it, but health checks). */
  authorization: Record<MeshService, AuthorizationRule[]>;
}

/** The SPIFFE ID of a service's instances: `spiffe://<trustDomain>/<service>`. */
export function spiffeId(policy: Pick<MeshPolicy, 'identity'>, service: MeshService | typeof OPERATOR): string {
  return `spiffe://${policy.identity.trustDomain}/${service}`;
}

/** Whether a method pattern (`/pkg.Service/Method` or `/pkg.Service/*`) covers a method path. */
export function methodPatternMatches(pattern: string, path: string): boolean {
  return pattern.endsWith('/*') ? path.startsWith(pattern.slice(0, -1)) : path === pattern;
}

/**
 * Whether the policy lets `caller` (a service, or a caller with no identity: undefined) call the
 * method `path` of `callee`. Health checks are always allowed.
 */
export function isCallAuthorized(
  policy: Pick<MeshPolicy, 'authorization'>,
  caller: MeshService | typeof OPERATOR | undefined,
  callee: MeshService,
  path: string,
): boolean {
  if (methodPatternMatches(HEALTH_METHODS, path)) return true;
  return policy.authorization[callee].some(
    (rule) =>
      (rule.from.includes(ANYONE) || (caller !== undefined && rule.from.includes(caller))) &&
      rule.methods.some((m) => methodPatternMatches(m, path)),
  );
}

/**
 * Reads and validates a policy (YAML or JSON text). Throws a MeshPolicyError listing every problem,
 * each naming its field; a policy that passes can be compiled without further checks.
 */
export function parseMeshPolicy(text: string, source = 'mesh policy'): MeshPolicy {
  let document: unknown;
  try {
    document = parseYaml(text, { prettyErrors: true, uniqueKeys: true });
  } catch (error) {
    throw new MeshPolicyError(source, [`not valid YAML: ${error instanceof Error ? error.message : String(error)}`]);
  }
  const parsed = policySchema.safeParse(document);
  if (!parsed.success) {
    throw new MeshPolicyError(
      source,
      parsed.error.issues.map((issue) => `${fieldPath(issue.path) || '(document)'}: ${issue.message}`),
    );
  }
  const policy = parsed.data;
  const problems: string[] = [];
  const services = Object.fromEntries(
    MESH_SERVICES.map((s) => [
      s,
      {
        port: policy.services[s].port,
        subsets: policy.services[s].subsets ?? {},
        inboundFault: policy.services[s].inboundFault,
      },
    ]),
  ) as MeshPolicy['services'];
  for (const s of MESH_SERVICES) {
    const subset = services[s].inboundFault?.subset;
    if (subset !== undefined && !(subset in services[s].subsets)) {
      const known = Object.keys(services[s].subsets);
      problems.push(
        `services.${s}.inboundFault.subset: ${s} has no subset "${subset}" (${known.length === 0 ? `services.${s}.subsets is empty` : `known: ${known.join(', ')}`})`,
      );
    }
  }

  const ports = new Map<number, string>();
  for (const s of MESH_SERVICES) {
    const other = ports.get(services[s].port);
    if (other !== undefined) problems.push(`services.${s}.port: ${services[s].port} is also ${other}'s port`);
    ports.set(services[s].port, `services.${s}`);
  }
  for (const field of ['inboundPort', 'adminPort', 'statsPort'] as const) {
    const value = policy.sidecar[field];
    const other = ports.get(value);
    if (other !== undefined) problems.push(`sidecar.${field}: ${value} is also ${other}'s port`);
    ports.set(value, `sidecar.${field}`);
  }

  const seen = new Set<string>();
  const edges: MeshEdge[] = [];
  policy.edges.forEach((edge, i) => {
    const at = `edges[${i}]`;
    const subsets = services[edge.to].subsets;
    const checkSubset = (subset: string, field: string) => {
      if (!(subset in subsets)) {
        const known = Object.keys(subsets);
        problems.push(
          `${at}.${field}: ${edge.to} has no subset "${subset}" (${known.length === 0 ? `services.${edge.to}.subsets is empty` : `known: ${known.join(', ')}`})`,
        );
      }
    };
    edge.routes?.forEach((route, j) => checkSubset(route.subset, `routes[${j}].subset`));
    edge.split?.forEach((part, j) => checkSubset(part.subset, `split[${j}].subset`));
    if (edge.mirror !== undefined) checkSubset(edge.mirror.subset, 'mirror.subset');
    if (edge.split !== undefined && edge.split.reduce((sum, part) => sum + part.weight, 0) === 0) {
      problems.push(`${at}.split: the weights add up to 0, so no request could be sent`);
    }
    const splitSubsets = edge.split?.map((part) => part.subset) ?? [];
    if (new Set(splitSubsets).size !== splitSubsets.length)
      problems.push(`${at}.split: a subset is named more than once`);
    const retry = { ...policy.defaults.retry, ...edge.retry };
    if (retry.backoff.base > retry.backoff.max) problems.push(`${at}.retry.backoff: base is longer than max`);
    const timeoutMs = edge.timeout ?? policy.defaults.timeout;
    if (retry.perTryTimeout !== undefined && timeoutMs > 0 && retry.perTryTimeout > timeoutMs) {
      problems.push(`${at}.retry.perTryTimeout: longer than the edge's timeout (${timeoutMs} ms)`);
    }
    const outlierDetection = { ...policy.defaults.outlierDetection, ...edge.outlierDetection };
    for (const from of Array.isArray(edge.from) ? edge.from : [edge.from]) {
      if (from === edge.to) problems.push(`${at}: ${from} cannot be its own upstream`);
      const key = `${from}->${edge.to}`;
      if (seen.has(key)) problems.push(`${at}: the edge ${from} -> ${edge.to} is declared more than once`);
      seen.add(key);
      edges.push({
        from,
        to: edge.to,
        timeoutMs,
        connectTimeoutMs: edge.connectTimeout ?? policy.defaults.connectTimeout,
        retry,
        outlierDetection,
        circuitBreakers: { ...policy.defaults.circuitBreakers, ...edge.circuitBreakers },
        loadBalancing: edge.loadBalancing ?? policy.defaults.loadBalancing,
        routes: (edge.routes ?? []).map((r) => ({ header: r.match.header, exact: r.match.exact, subset: r.subset })),
        split: edge.split ?? [],
        mirror: edge.mirror,
        fault: edge.fault,
      });
    }
  });
  const authorization = Object.fromEntries(MESH_SERVICES.map((s) => [s, [] as AuthorizationRule[]])) as Record<
    MeshService,
    AuthorizationRule[]
  >;
  for (const [callee, rules] of Object.entries(policy.authorization)) {
    if (!(MESH_SERVICES as readonly string[]).includes(callee)) {
      problems.push(`authorization.${callee}: not a service of the mesh (${MESH_SERVICES.join(', ')})`);
      continue;
    }
    rules.forEach((rule, i) => {
      const at = `authorization.${callee}[${i}]`;
      const from: MeshCaller[] = [];
      (Array.isArray(rule.from) ? rule.from : [rule.from]).forEach((name, j) => {
        if ((MESH_SERVICES as readonly string[]).includes(name) || name === ANYONE || name === OPERATOR)
          from.push(name as MeshCaller);
        else
          problems.push(
            `${at}.from${Array.isArray(rule.from) ? `[${j}]` : ''}: "${name}" is not a service of the mesh (${MESH_SERVICES.join(', ')}), nor ${OPERATOR} or ${ANYONE}`,
          );
      });
      const twice = (list: readonly string[]) => list.filter((item, j) => list.indexOf(item) !== j);
      for (const name of new Set(twice(from))) problems.push(`${at}.from: ${name} is named more than once`);
      for (const method of new Set(twice(rule.methods)))
        problems.push(`${at}.methods: ${method} is named more than once`);
      authorization[callee as MeshService].push({ from, methods: rule.methods });
    });
  }
  // A caller the policy routes to a callee must be allowed to call it, or every call on the edge is refused.
  policy.edges.forEach((edge, i) => {
    for (const from of Array.isArray(edge.from) ? edge.from : [edge.from]) {
      if (
        from !== edge.to &&
        !authorization[edge.to].some((rule) => rule.from.includes(from) || rule.from.includes(ANYONE))
      ) {
        problems.push(
          `edges[${i}]: ${from} calls ${edge.to}, but authorization.${edge.to} lets ${from} call none of its methods`,
        );
      }
    }
  });
  if (problems.length > 0) throw new MeshPolicyError(source, problems);
  return {
    kubernetes: policy.kubernetes,
    sidecar: policy.sidecar,
    services,
    edges,
    tracing: policy.tracing,
    mtls: policy.mtls,
    identity: policy.identity,
    authorization,
  };
}
