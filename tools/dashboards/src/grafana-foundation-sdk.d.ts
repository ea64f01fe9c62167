// The SDK publishes its entry points only through package.json "exports" (`…/dashboard`,
// `…/timeseries`, …), which the workspace's node10 module resolution does not read. Node and Jest
// do read it, so the code imports the public subpaths and these declarations hand TypeScript the
// typings that sit behind them.
declare module '@grafana/grafana-foundation-sdk/cog' {
  export * from '@grafana/grafana-foundation-sdk/dist/cog';
}
declare module '@grafana/grafana-foundation-sdk/common' {
  export * from '@grafana/grafana-foundation-sdk/dist/common';
}
declare module '@grafana/grafana-foundation-sdk/dashboard' {
  export * from '@grafana/grafana-foundation-sdk/dist/dashboard';
}
declare module '@grafana/grafana-foundation-sdk/gauge' {
  export * from '@grafana/grafana-foundation-sdk/dist/gauge';
}
declare module '@grafana/grafana-foundation-sdk/heatmap' {
  export * from '@grafana/grafana-foundation-sdk/dist/heatmap';
}
declare module '@grafana/grafana-foundation-sdk/prometheus' {
  export * from '@grafana/grafana-foundation-sdk/dist/prometheus';
}
declare module '@grafana/grafana-foundation-sdk/stat' {
  export * from '@grafana/grafana-foundation-sdk/dist/stat';
}
declare module '@grafana/grafana-foundation-sdk/timeseries' {
  export * from '@grafana/grafana-foundation-sdk/dist/timeseries';
}
