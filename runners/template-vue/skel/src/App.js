export default {
  data: () => ({ count: 0 }),
  template: `
    <main>
      <h1>Hello from Vue</h1>
      <button @click="count++">clicked {{ count }} times</button>
    </main>`,
};
