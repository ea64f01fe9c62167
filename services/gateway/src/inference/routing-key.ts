import { Errors } from '@infermesh/grpc';

/** The header (REST) and metadata key (gRPC) a caller sets to stay on one version of an A/B experiment. */
export const ROUTING_KEY_HEADER = 'x-routing-key';

const PRINTABLE = /^[\x21-\x7e]{1,256}$/;

/**
 * What keeps a caller on one version of a sticky rollout: its `x-routing-key`, else its tenant. A
 * routing key that is not 1 to 256 printable ASCII characters is an INVALID_ARGUMENT.
 */
function routingKeyOf(explicit: string | undefined, tenant: string): string {
  if (explicit === undefined) return tenant;
  if (!PRINTABLE.test(explicit))
    throw Errors.invalidRequest(`${ROUTING_KEY_HEADER} must be 1 to 256 printable ASCII characters without spaces`);
  return explicit;
}

/**
 * The caller's identity on a request: its tenant (its API key's, never the key itself: see
 * ApiKeyAuth) and its routing key.
 */
export function callerOf(
  explicitRoutingKey: string | undefined,
  principal: { tenant: string },
): { tenant: string; routingKey: string } {
  return { tenant: principal.tenant, routingKey: routingKeyOf(explicitRoutingKey, principal.tenant) };
}
