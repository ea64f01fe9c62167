import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

/**
 * A proxyless gRPC client of the mesh in a process of its own (grpc-js-xds keeps one xDS client per
 * process for the life of the process): a channel to `target` (`xds:///router`) built from the
 * given xDS bootstrap, calling one unary method with an empty request. Each line `N` on its stdin
 * makes N calls, one after the other; it answers with one line of JSON: the count of each answer,
 * the response bytes as text (utf8 or hex), or `error <CODE>`.
 */
const PROBE = `
const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();
const id = (b) => b;
const client = new grpc.Client(process.env.XDS_TARGET, grpc.credentials.createInsecure(), {
  'grpc.TEST_ONLY_DO_NOT_USE_IN_PROD.xds_bootstrap_config': process.env.XDS_BOOTSTRAP,
});
const call = () => new Promise((resolve) => client.makeUnaryRequest(process.env.XDS_METHOD, id, id, Buffer.alloc(0), { deadline: Date.now() + 5000 },
  (error, value) => resolve(error ? 'error ' + grpc.status[error.code] : value.toString(process.env.XDS_FORMAT))));
require('node:readline').createInterface({ input: process.stdin }).on('line', async (line) => {
  const counts = {};
  for (let i = 0; i < Number(line); i += 1) { const answer = await call(); counts[answer] = (counts[answer] || 0) + 1; }
  process.stdout.write(JSON.stringify(counts) + '\\n');
});
`;

export interface XdsProbe {
  /** Makes `calls` calls one after the other: how many got each answer. */
  tally(calls: number): Promise<Record<string, number>>;
  close(): void;
}

export interface XdsProbeOptions {
  /** The control plane's address, host:port. */
  controlPlane: string;
  /** The calling service, as the node's cluster: the policy's edges from it apply. */
  caller: string;
  target: string;
  /** The full method path: /grpc.health.v1.Health/Check. */
  method: string;
  format: 'utf8' | 'hex';
}

export function startXdsProbe(options: XdsProbeOptions): XdsProbe {
  const bootstrap = {
    xds_servers: [
      { server_uri: options.controlPlane, channel_creds: [{ type: 'insecure' }], server_features: ['xds_v3'] },
    ],
    node: { id: `${options.caller}-probe-${process.pid}`, cluster: options.caller, locality: {} },
  };
  const child: ChildProcessWithoutNullStreams = spawn(process.execPath, ['-e', PROBE], {
    env: {
      ...process.env,
      XDS_BOOTSTRAP: JSON.stringify(bootstrap),
      XDS_TARGET: options.target,
      XDS_METHOD: options.method,
      XDS_FORMAT: options.format,
    },
  });
  child.stderr.on('data', (chunk: Buffer) => process.stderr.write(chunk));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  return {
    tally: async (calls) => {
      child.stdin.write(`${calls}\n`);
      const line = await lines.next();
      if (line.done === true) throw new Error('the xDS probe exited');
      return JSON.parse(String(line.value)) as Record<string, number>;
    },
    close: () => child.kill(),
  };
}
