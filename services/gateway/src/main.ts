import { loadOrExit } from '@infermesh/config';
import { runMain } from '@infermesh/runtime';
import { loadGatewayConfig } from './gateway.config';
import { startGateway } from './gateway.start';

runMain('gateway', async () => startGateway(loadOrExit('gateway', () => loadGatewayConfig(process.env))));
