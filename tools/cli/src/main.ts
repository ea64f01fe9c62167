import { ConfigError } from '@infermesh/config';
import { resolve } from 'node:path';
import { loadCliConfig } from './cli.config';
import { up } from './up.command';

const USAGE = `Usage: infermesh <command>

Commands:
  up        Start the six services on this machine with the demo models (what \`npm start\` runs)
  help      Show this help

Environment (up):
  INFERMESH_API_KEY           API key clients must send (generated and printed when unset)
  REDIS_URL                   Use Redis for the registry and the result cache (embedded stores otherwise)
  INFERMESH_DATA_DIR          Where embedded stores and artifacts live (default .infermesh)
  INFERMESH_HOST              Address the services listen on (default 127.0.0.1)
  INFERMESH_DEMO_MODELS       Demo models to register (default mlp,tiny,multi-io,classifier)
  INFERMESH_LOG_LEVEL         debug | info | warn | error (default info)
  INFERMESH_READY_TIMEOUT_MS  How long to wait for the system to be ready (default 120000)
`;

async function main(argv: string[]): Promise<number> {
  const command = argv[0] ?? 'help';
  switch (command) {
    case 'up': {
      const config = loadCliConfig(process.env);
      await up(config, resolve(__dirname, '..', '..', '..'));
      return 0;
    }
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(USAGE);
      return 0;
    default:
      process.stderr.write(`infermesh: unknown command "${command}"\n\n${USAGE}`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`infermesh: ${error instanceof ConfigError ? error.message : error instanceof Error ? error.message : String(error)}\n`);
    process.exit(1);
  },
);
