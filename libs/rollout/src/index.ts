export * from './resource-names';
export * from './rollout';
