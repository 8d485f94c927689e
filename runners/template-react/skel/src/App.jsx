import { useState } from 'react';

export default function App() {
  const [count, setCount] = useState(0);
  return (
    <main>
      <h1>Hello from React</h1>
      <button onClick={() => setCount(count + 1)}>clicked {count} times</button>
    </main>
  );
}
