import type { InboundAuthorization } from '@infermesh/grpc';

/*
 * Who may call what on a proxyless service's gRPC server: the mesh policy's `authorization` for the
 * service, as the RBAC filter of its inbound listener says it (the filter its sidecar would run;
 * envoy-security.ts compiles it). The server enforces it on every call, by the caller's identity.
 */

type Json = Record<string, unknown>;

const HCM = 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager';
const RBAC = 'type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC';

const isObject = (value: unknown): value is Json =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** One side of a rule: whether it matches, and how to say what it matches. */
interface Matcher {
  matches: (value: string | undefined) => boolean;
  /** What it matches, in words (a caller's name, a method pattern). */
  words: string[];
}

/** Throws, naming where, unless `object` has no fields but `allowed`. */
function onlyFields(object: Json, allowed: readonly string[], at: string): void {
  const other = Object.keys(object).filter((key) => !allowed.includes(key));
  if (other.length > 0) throw new Error(`${at}.${other[0]}: not supported by a proxyless server`);
}

/** A StringMatcher with `exact` or `prefix` (and nothing else: no ignore_case, no regex). */
function stringMatcher(value: unknown, at: string): { exact: string } | { prefix: string } {
  if (!isObject(value)) throw new Error(`${at}: expected a string matcher`);
  onlyFields(value, ['exact', 'prefix'], at);
  if (typeof value['exact'] === 'string' && value['prefix'] === undefined) return { exact: value['exact'] };
  if (typeof value['prefix'] === 'string' && value['exact'] === undefined) return { prefix: value['prefix'] };
  throw new Error(`${at}: expected exact or prefix`);
}

/** The caller a principal name stands for: a service's name for `spiffe://<trust domain>/<service>`, else the ID itself. */
function callerName(id: string): string {
  return /^spiffe:\/\/[^/]+\/([^/]+)$/.exec(id)?.[1] ?? id;
}

/** A permission: `url_path.path` exact or prefix, `any`, or `or_rules` of those. */
function permission(value: unknown, at: string): Matcher {
  if (!isObject(value)) throw new Error(`${at}: expected a permission`);
  const [rule, ...more] = Object.keys(value);
  if (rule === undefined || more.length > 0)
    throw new Error(`${at}: expected one rule, got ${rule === undefined ? 'none' : Object.keys(value).join(', ')}`);
  const content = value[rule];
  switch (rule) {
    case 'any':
      if (content !== true) throw new Error(`${at}.any: expected true`);
      return { matches: () => true, words: ['any method'] };
    case 'url_path': {
      if (!isObject(content)) throw new Error(`${at}.url_path: expected a path matcher`);
      onlyFields(content, ['path'], `${at}.url_path`);
      const match = stringMatcher(content['path'], `${at}.url_path.path`);
      return 'exact' in match
        ? { matches: (path) => path === match.exact, words: [match.exact] }
        : {
            matches: (path) => path !== undefined && path.startsWith(match.prefix),
            words: [`${match.prefix}${match.prefix.endsWith('/') ? '*' : '…'}`],
          };
    }
    case 'or_rules':
      return anyOf(content, 'rules', permission, `${at}.or_rules`);
    default:
      throw new Error(`${at}.${rule}: not supported by a proxyless server`);
  }
}

/** A principal: `authenticated.principal_name` exact (unset: any caller with a certificate), `any`, or `or_ids` of those. */
function principal(value: unknown, at: string): Matcher {
  if (!isObject(value)) throw new Error(`${at}: expected a principal`);
  const [rule, ...more] = Object.keys(value);
  if (rule === undefined || more.length > 0)
    throw new Error(
      `${at}: expected one identifier, got ${rule === undefined ? 'none' : Object.keys(value).join(', ')}`,
    );
  const content = value[rule];
  switch (rule) {
    case 'any':
      if (content !== true) throw new Error(`${at}.any: expected true`);
      return { matches: () => true, words: ['anyone'] };
    case 'authenticated': {
      if (!isObject(content)) throw new Error(`${at}.authenticated: expected an object`);
      onlyFields(content, ['principal_name'], `${at}.authenticated`);
      if (content['principal_name'] === undefined)
        return { matches: (id) => id !== undefined, words: ['any caller with a certificate'] };
      const match = stringMatcher(content['principal_name'], `${at}.authenticated.principal_name`);
      if (!('exact' in match)) throw new Error(`${at}.authenticated.principal_name: only exact is supported`);
      return { matches: (id) => id === match.exact, words: [callerName(match.exact)] };
    }
    case 'or_ids':
      return anyOf(content, 'ids', principal, `${at}.or_ids`);
    default:
      throw new Error(`${at}.${rule}: not supported by a proxyless server`);
  }
}

/** A Set of rules or ids: matches when one of them does. */
function anyOf(
  value: unknown,
  field: 'rules' | 'ids',
  each: (item: unknown, at: string) => Matcher,
  at: string,
): Matcher {
  if (!isObject(value)) throw new Error(`${at}: expected an object`);
  onlyFields(value, [field], at);
  const items = value[field];
  if (!Array.isArray(items) || items.length === 0) throw new Error(`${at}.${field}: expected at least one`);
  const matchers = items.map((item, i) => each(item, `${at}.${field}[${i}]`));
  return { matches: (v) => matchers.some((m) => m.matches(v)), words: matchers.flatMap((m) => m.words) };
}

/** Method patterns in few words: exact methods of one service as `/pkg.Service/{A,B}`. */
function methodWords(words: string[]): string {
  const byService = new Map<string, string[]>();
  const out: string[] = [];
  for (const word of words) {
    const match = /^(\/[^/]+\/)([A-Za-z0-9_]+)$/.exec(word);
    if (match === null) out.push(word);
    else byService.set(match[1]!, [...(byService.get(match[1]!) ?? []), match[2]!]);
  }
  for (const [service, methods] of byService)
    out.push(methods.length === 1 ? `${service}${methods[0]}` : `${service}{${methods.join(',')}}`);
  return out.join(', ');
}

/**
 * The inbound authorization of a proxyless server, read from its inbound listener as the control
 * plane serves it (an HTTP connection manager whose filters are the RBAC filter, the fault filter and
 * the router). undefined: the listener has no RBAC filter (the mesh runs without mTLS). Throws naming
 * what it cannot honour exactly (another action than ALLOW, shadow rules, conditions, matchers other
 * than exact SPIFFE IDs and exact or prefix paths), so the update is refused (NACK) rather than
 * enforced wrongly.
 */
export function inboundAuthorizationOf(listener: unknown): InboundAuthorization | undefined {
  const chains = ((listener as Json | undefined)?.['filter_chains'] ?? []) as Json[];
  if (chains.length !== 1) throw new Error(`inbound listener: expected one filter chain, got ${chains.length}`);
  const filters = (chains[0]!['filters'] ?? []) as Json[];
  const hcm = filters[0]?.['typed_config'] as Json | undefined;
  if (filters.length !== 1 || hcm?.['@type'] !== HCM)
    throw new Error('inbound listener: expected one HTTP connection manager');
  const httpFilters = (hcm['http_filters'] ?? []) as Json[];
  const found = httpFilters.flatMap((filter, i) =>
    (filter['typed_config'] as Json | undefined)?.['@type'] === RBAC ? [[filter, i] as const] : [],
  );
  if (found.length === 0) return undefined;
  if (found.length > 1)
    throw new Error(
      `inbound listener: http_filters[${found[1]![1]}]: a second RBAC filter is not supported by a proxyless server`,
    );
  const [filter, index] = found[0]!;
  const at = `inbound listener: http_filters[${index}].typed_config`;
  const config = filter['typed_config'] as Json;
  onlyFields(config, ['@type', 'rules', 'rules_stat_prefix'], at);
  const rules = config['rules'];
  // No rules: the filter allows every call (Envoy's RBAC without rules_specifier does nothing).
  if (rules === undefined)
    throw new Error(`${at}.rules: required (a filter without rules is not supported by a proxyless server)`);
  if (!isObject(rules)) throw new Error(`${at}.rules: expected an object`);
  onlyFields(rules, ['action', 'policies'], `${at}.rules`);
  if (rules['action'] !== undefined && rules['action'] !== 'ALLOW' && rules['action'] !== 0) {
    throw new Error(
      `${at}.rules.action: only ALLOW is supported by a proxyless server, got ${JSON.stringify(rules['action'])}`,
    );
  }
  const rawPolicies = rules['policies'] ?? {};
  if (!isObject(rawPolicies)) throw new Error(`${at}.rules.policies: expected a map`);
  const policies = Object.entries(rawPolicies).map(([name, body]) => {
    const where = `${at}.rules.policies.${name}`;
    if (!isObject(body)) throw new Error(`${where}: expected a policy`);
    onlyFields(body, ['permissions', 'principals'], where);
    const list = (field: 'permissions' | 'principals'): unknown[] => {
      const items: unknown = body[field];
      if (!Array.isArray(items) || items.length === 0) throw new Error(`${where}.${field}: expected at least one`);
      return items;
    };
    const permissions = list('permissions').map((p, i) => permission(p, `${where}.permissions[${i}]`));
    const principals = list('principals').map((p, i) => principal(p, `${where}.principals[${i}]`));
    return { permissions, principals };
  });
  const vhosts = ((hcm['route_config'] as Json | undefined)?.['virtual_hosts'] ?? []) as Json[];
  const callee = typeof vhosts[0]?.['name'] === 'string' ? vhosts[0]['name'] : 'this service';
  const text =
    policies.length === 0
      ? `${callee} is called by nobody`
      : `${callee} is called by ${policies
          .map(
            (p) =>
              `${p.principals.flatMap((m) => m.words).join(', ')} (${methodWords(p.permissions.flatMap((m) => m.words))})`,
          )
          .join('; ')}`;
  return {
    allows: (identity, path) =>
      policies.some((p) => p.principals.some((m) => m.matches(identity)) && p.permissions.some((m) => m.matches(path))),
    describe: () => text,
  };
}
