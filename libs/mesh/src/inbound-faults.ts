import type { InboundFaults } from '@infermesh/grpc';
import { durationMs } from './envoy-api-check';

type Json = Record<string, unknown>;

const HCM = 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager';
const FAULT = 'type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault';
const ROUTER = 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router';
/** The RBAC filter of the policy's authorization: inboundAuthorizationOf reads it, so it is passed over here. */
const RBAC = 'type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC';
const DENOMINATORS: Readonly<Record<string, number>> = { HUNDRED: 100, TEN_THOUSAND: 10_000, MILLION: 1_000_000 };

/** A FractionalPercent as a percentage. */
function percentOf(fraction: unknown, at: string): number {
  const { numerator = 0, denominator = 'HUNDRED' } = (fraction ?? {}) as { numerator?: number; denominator?: string };
  const scale = DENOMINATORS[denominator];
  if (scale === undefined) throw new Error(`${at}.denominator: ${denominator} is not a denominator`);
  return Math.min(100, (Number(numerator) * 100) / scale);
}

/** Which method paths the fault's header matchers select: only `:path` exact/prefix matchers (inverted or not) are understood. */
function pathMatcher(headers: unknown, at: string): (path: string) => boolean {
  const matchers = ((headers ?? []) as Json[]).map((header, i) => {
    const where = `${at}.headers[${i}]`;
    const stringMatch = header['string_match'] as Json | undefined;
    if (header['name'] !== ':path' || stringMatch === undefined)
      throw new Error(`${where}: only string matches on :path are supported`);
    const invert = header['invert_match'] === true;
    if (typeof stringMatch['exact'] === 'string') return (path: string) => (path === stringMatch['exact']) !== invert;
    if (typeof stringMatch['prefix'] === 'string')
      return (path: string) => path.startsWith(String(stringMatch['prefix'])) !== invert;
    throw new Error(`${where}.string_match: only exact and prefix are supported`);
  });
  return (path) => matchers.every((matches) => matches(path));
}

/**
 * The faults a proxyless server injects, read from its inbound listener (as served by the control
 * plane: an HTTP connection manager whose filters are the RBAC filter (with mTLS; read by
 * inboundAuthorizationOf, passed over here), the fault filter, if any, then the router).
 * undefined: no fault. Throws naming what it cannot honour, so the update is refused (NACK) rather
 * than half applied.
 */
export function inboundFaultsOf(listener: unknown): InboundFaults | undefined {
  const chains = ((listener as Json | undefined)?.['filter_chains'] ?? []) as Json[];
  if (chains.length !== 1) throw new Error(`inbound listener: expected one filter chain, got ${chains.length}`);
  const filters = (chains[0]!['filters'] ?? []) as Json[];
  const hcm = filters[0]?.['typed_config'] as Json | undefined;
  if (filters.length !== 1 || hcm?.['@type'] !== HCM)
    throw new Error('inbound listener: expected one HTTP connection manager');
  let faults: InboundFaults | undefined;
  ((hcm['http_filters'] ?? []) as Json[]).forEach((filter, i) => {
    const at = `inbound listener: http_filters[${i}]`;
    const config = filter['typed_config'] as Json | undefined;
    if (config?.['@type'] === ROUTER || config?.['@type'] === RBAC) return;
    if (config?.['@type'] !== FAULT)
      throw new Error(`${at}: ${String(config?.['@type'] ?? filter['name'])} is not supported by a proxyless server`);
    const abort = config['abort'] as Json | undefined;
    const delay = config['delay'] as Json | undefined;
    if (abort !== undefined && typeof abort['grpc_status'] !== 'number')
      throw new Error(`${at}.abort: only grpc_status aborts are supported`);
    faults = {
      ...(abort !== undefined && {
        abort: {
          code: abort['grpc_status'] as number,
          percent: percentOf(abort['percentage'], `${at}.abort.percentage`),
        },
      }),
      ...(delay !== undefined && {
        delay: {
          ms: durationMs(delay['fixed_delay'], `${at}.delay.fixed_delay`),
          percent: percentOf(delay['percentage'], `${at}.delay.percentage`),
        },
      }),
      appliesTo: pathMatcher(config['headers'], at),
    };
  });
  return faults;
}
