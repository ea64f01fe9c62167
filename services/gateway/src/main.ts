import { tuneHeapForTensors, loadOrExit } from '@infermesh/config';
import { runMain } from '@infermesh/runtime';
import { loadGatewayConfig } from './gateway.config';
import { startGateway } from './gateway.start';

// Requests carry tensors through this service: see tuneHeapForTensors.
tuneHeapForTensors();

runMain('gateway', async () => startGateway(loadOrExit('gateway', () => loadGatewayConfig(process.env))));
