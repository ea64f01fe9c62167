export * from './mesh-policy';
export * from './envoy-bootstrap';
export * from './envoy-api-check';
export * from './envoy-files';
export * from './xds-resources';
export * from './ads-server';
