export * from './resource-names';
export * from './rollout';
export * from './traffic';
export * from './auto-rollout-analysis';
