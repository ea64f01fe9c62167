import type { FlagSpec } from './args';

/** The flags of every command that calls the gateway's admin API. */
export const GATEWAY_FLAGS: readonly FlagSpec[] = [
  {
    name: 'gateway',
    kind: 'value',
    placeholder: '<host:port>',
    description: "The gateway's gRPC address (env INFERMESH_GATEWAY, default 127.0.0.1:8001)",
  },
  {
    name: 'api-key',
    kind: 'value',
    placeholder: '<key>',
    description: 'An admin API key of the gateway (env INFERMESH_API_KEY)',
  },
  { name: 'json', kind: 'switch', description: 'Print the result as protobuf JSON on stdout, without progress' },
];
