import { createHash } from 'node:crypto';
import { RpcError } from '@infermesh/grpc';

/** The header (REST) and metadata key (gRPC) a caller sets to stay on one version of an A/B experiment. */
export const ROUTING_KEY_HEADER = 'x-routing-key';

const PRINTABLE = /^[\x21-\x7e]{1,256}$/;

/** Who sends a request: a digest of the API key it presented (the key itself never leaves the gateway); empty without one. */
function tenantOf(authorization: string | undefined): string {
  if (authorization === undefined || authorization === '') return '';
  return `key:${createHash('sha256').update(authorization.trim()).digest('hex').slice(0, 32)}`;
}

/**
 * What keeps a caller on one version of a sticky rollout: its `x-routing-key`, else its tenant. A
 * routing key that is not 1 to 256 printable ASCII characters is an INVALID_ARGUMENT.
 */
function routingKeyOf(explicit: string | undefined, tenant: string): string {
  if (explicit === undefined) return tenant;
  if (!PRINTABLE.test(explicit)) throw RpcError.invalidArgument(`${ROUTING_KEY_HEADER} must be 1 to 256 printable ASCII characters without spaces`);
  return explicit;
}

/** The caller's identity on a request: its tenant and its routing key. */
export function callerOf(explicitRoutingKey: string | undefined, authorization: string | undefined): { tenant: string; routingKey: string } {
  const tenant = tenantOf(authorization);
  return { tenant, routingKey: routingKeyOf(explicitRoutingKey, tenant) };
}
